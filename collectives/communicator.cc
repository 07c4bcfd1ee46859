#include "collectives/communicator.h"

namespace kiln {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kBf16:
    case DataType::kFp16:
      return 2;
    case DataType::kFp32:
      return 4;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kBf16:
      return "bf16";
    case DataType::kFp16:
      return "fp16";
    case DataType::kFp32:
      return "fp32";
  }
  return "unknown";
}

}  // namespace kiln
