#include "tools/memory_planner_output.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/config/quoted.h"

namespace kiln {
namespace {

double Share(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

std::string SizeRange(const google::protobuf::RepeatedField<int32_t>& sizes) {
  const int first = sizes.Get(0);
  const int last = sizes.Get(sizes.size() - 1);
  return first == last ? absl::StrCat("size ", first) : absl::StrCat("sizes ", first, "..", last);
}

// "27 decode graphs, sizes 1..256 + 14 prefill graphs, sizes 16..512 tokens" (and how piecewise
// graphs split each key).
std::string GraphSummary(const MemoryPlan& plan) {
  const config::GraphConfig& g = plan.config.graph();
  if (g.capture_sizes_size() == 0) return "no CUDA graphs";
  std::string out;
  if (g.mode() == config::GRAPH_MODE_PREFILL_ONLY) {
    out = absl::StrCat(g.capture_sizes_size(), " prefill-only graphs, ",
                       SizeRange(g.capture_sizes()), " tokens");
  } else {
    out = absl::StrCat(g.capture_sizes_size(), " decode graphs, ", SizeRange(g.capture_sizes()));
    if (g.capture_prefill() && g.prefill_sizes_size() > 0) {
      absl::StrAppend(&out, " + ", g.prefill_sizes_size(), " prefill graphs, ",
                      SizeRange(g.prefill_sizes()), " tokens");
    }
  }
  if (g.execution() == config::GRAPH_EXECUTION_PIECEWISE) {
    absl::StrAppend(&out, "; piecewise, ", plan.config.model().num_layers() + 1,
                    " graphs per size");
  }
  return out;
}

// Returns the plan's title: "Llama-3.1-8B (bf16) on NVIDIA H100 80GB HBM3, tensor_parallel_size 1".
// The model and GPU names come from the user (a flag, a config file): with `escaped` they are
// written as Escaped writes them, for the text table on a terminal, where an ESC, a newline or
// U+009B would send a terminal sequence or break the title's line; the SVG escapes them as XML.
std::string Title(const MemoryPlan& plan, bool escaped) {
  const config::PlannerConfig& c = plan.config;
  const std::string& model = c.model().name();
  const std::string& gpu = c.gpu().name();
  return absl::StrCat(escaped ? Escaped(model) : model, " (", DTypeName(c.model().dtype()), ") on ",
                      escaped ? Escaped(gpu) : gpu, ", tensor_parallel_size ",
                      c.tensor_parallel_size());
}

// Returns `text` with each byte that starts no well-formed UTF-8 sequence replaced by U+FFFD, and
// with `xml` also the characters XML 1.0 cannot hold, even escaped (controls but tab, newline and
// return; U+FFFE and U+FFFF). A model or GPU name comes from the user (a flag, a config file); a
// name of any bytes must still give a well-formed SVG and JSON (protobuf's JSON printer drops
// such a string's bad bytes with an error on stderr).
std::string ValidText(absl::string_view text, bool xml) {
  constexpr absl::string_view kReplacement = "\xef\xbf\xbd";
  std::string out;
  while (!text.empty()) {
    const size_t n = Utf8CharLength(text);
    const absl::string_view c = text.substr(0, n);
    const bool bad_for_xml = xml && ((n == 1 && static_cast<unsigned char>(c[0]) < 0x20 &&
                                      c[0] != '\t' && c[0] != '\n' && c[0] != '\r') ||
                                     c == "\xef\xbf\xbe" || c == "\xef\xbf\xbf");
    if (n == 0 || bad_for_xml) {
      out.append(kReplacement.data(), kReplacement.size());
      text.remove_prefix(n == 0 ? 1 : n);
      continue;
    }
    out.append(c.data(), c.size());
    text.remove_prefix(n);
  }
  return out;
}

std::string EscapeXml(const std::string& text) {
  return absl::StrReplaceAll(ValidText(text, /*xml=*/true),
                             {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

// One color per term, in the order the planner lists them; the KV cache stands out in green.
const char* TermColor(const std::string& name) {
  static const struct {
    const char* name;
    const char* color;
  } kColors[] = {
      {"weights", "#4e79a7"},
      {"activation_arena", "#f28e2b"},
      {"attention_workspace", "#e15759"},
      {"graph_pool", "#76b7b2"},
      {"graph_executables", "#b07aa1"},
      {"custom_allreduce", "#edc948"},
      {"nccl", "#ff9da7"},
      {"cublaslt_workspace", "#9c755f"},
      {"logits", "#bab0ac"},
      {"margin", "#d37295"},
      {"kv_cache", "#59a14f"},
      {"unused", "#f1f1f1"},
  };
  for (const auto& c : kColors) {
    if (name == c.name) return c.color;
  }
  return "#888888";
}

}  // namespace

tools::MemoryPlanReport ToReport(const MemoryPlan& plan, int64_t context_tokens) {
  tools::MemoryPlanReport report;
  *report.mutable_config() = plan.config;
  // The strings a user gives, made UTF-8 (proto3 strings must be, for JSON and the wire).
  config::PlannerConfig* c = report.mutable_config();
  if (c->has_model_preset()) c->set_model_preset(ValidText(c->model_preset(), false));
  if (c->has_gpu_preset()) c->set_gpu_preset(ValidText(c->gpu_preset(), false));
  if (c->model().has_name()) c->mutable_model()->set_name(ValidText(c->model().name(), false));
  if (c->gpu().has_name()) c->mutable_gpu()->set_name(ValidText(c->gpu().name(), false));
  if (c->model().rope_scaling().has_rope_type()) {
    c->mutable_model()->mutable_rope_scaling()->set_rope_type(
        ValidText(c->model().rope_scaling().rope_type(), false));
  }
  report.set_total_bytes(plan.total_bytes);
  report.set_budget_bytes(plan.budget_bytes);
  for (const MemoryTerm& t : plan.terms) {
    tools::MemoryPlanReport::Term* term = report.add_terms();
    term->set_name(t.name);
    term->set_bytes(t.bytes);
    term->set_explanation(t.explanation);
  }
  report.set_reserved_bytes(plan.reserved_bytes);
  report.set_kv_bytes_per_token(plan.kv_bytes_per_token);
  report.set_kv_block_bytes(plan.kv_block_bytes);
  report.set_num_kv_blocks(plan.num_kv_blocks);
  report.set_kv_tokens(plan.KvTokens());
  report.set_context_tokens(context_tokens);
  report.set_max_concurrency(plan.MaxConcurrency(context_tokens));
  return report;
}

std::string RenderTable(const MemoryPlan& plan, int64_t context_tokens) {
  const config::PlannerConfig& c = plan.config;
  std::string out;
  absl::StrAppend(&out, "kiln memory plan: ", Title(plan, /*escaped=*/true), "\n");
  absl::StrAppendFormat(&out, "Budget per GPU: %s x gpu_memory_utilization %g = %s\n",
                        FormatBytes(plan.total_bytes), c.gpu_memory_utilization(),
                        FormatBytes(plan.budget_bytes));
  absl::StrAppend(&out, "Steps: max_num_seqs ", c.max_num_seqs(), ", max_num_batched_tokens ",
                  Thousands(c.max_num_batched_tokens()), "; ", GraphSummary(plan), "\n\n");

  size_t name_width = 6;  // "budget"
  for (const MemoryTerm& t : plan.terms) name_width = std::max(name_width, t.name.size());
  const int w = static_cast<int>(name_width);
  absl::StrAppendFormat(&out, "%-*s  %10s  %6s  %s\n", w, "term", "size", "share", "explanation");
  for (const MemoryTerm& t : plan.terms) {
    absl::StrAppendFormat(&out, "%-*s  %10s  %5.1f%%  %s\n", w, t.name, FormatBytes(t.bytes),
                          Share(t.bytes, plan.budget_bytes), t.explanation);
  }
  absl::StrAppendFormat(&out, "%s\n", std::string(name_width + 22, '-'));
  absl::StrAppendFormat(&out, "%-*s  %10s  %5.1f%%  the terms above, summed\n\n", w, "budget",
                        FormatBytes(plan.budget_bytes), 100.0);

  absl::StrAppend(&out, "KV cache: ", Thousands(plan.num_kv_blocks), " blocks of ", plan.block_size,
                  " tokens = ", Thousands(plan.KvTokens()), " tokens (",
                  FormatBytes(plan.kv_bytes_per_token), " per token, ",
                  DTypeName(c.kv_cache_dtype()), ")\n");
  const int64_t fit = plan.MaxConcurrency(context_tokens);
  absl::StrAppend(&out, "Max concurrency at ", Thousands(context_tokens), " tokens per sequence: ");
  if (fit < c.max_num_seqs()) {
    absl::StrAppend(&out, Thousands(fit), " sequences (the KV cache is the limit; max_num_seqs is ",
                    c.max_num_seqs(), ")\n");
  } else {
    absl::StrAppend(&out, c.max_num_seqs(),
                    " sequences (max_num_seqs is the limit; the KV cache holds ", Thousands(fit),
                    ")\n");
  }
  return out;
}

std::string RenderJson(const MemoryPlan& plan, int64_t context_tokens) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  google::protobuf::util::MessageToJsonString(ToReport(plan, context_tokens), &json, options);
  return json;
}

std::string RenderTextProto(const MemoryPlan& plan, int64_t context_tokens) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(ToReport(plan, context_tokens), &text);
  return text;
}

std::string RenderSvg(const MemoryPlan& plan) {
  constexpr double kLeft = 20, kBarTop = 56, kBarHeight = 40, kBarWidth = 1240, kRow = 20;
  struct Segment {
    std::string name;
    int64_t bytes;
    std::string color;
    std::string explanation;
  };
  std::vector<Segment> segments;
  for (const MemoryTerm& t : plan.terms) {
    segments.push_back({t.name, t.bytes, TermColor(t.name), t.explanation});
  }
  segments.push_back({"outside budget", plan.total_bytes - plan.budget_bytes, "#ffffff",
                      absl::StrFormat("the %g of the GPU that gpu_memory_utilization leaves out",
                                      1.0 - plan.config.gpu_memory_utilization())});

  const double height = kBarTop + kBarHeight + 24 + kRow * segments.size() + 12;
  std::string out;
  absl::StrAppendFormat(&out,
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1280\" height=\"%.0f\" "
                        "viewBox=\"0 0 1280 %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
                        height, height);
  const std::string title =
      EscapeXml(absl::StrCat("kiln memory plan: ", Title(plan, /*escaped=*/false)));
  absl::StrAppend(&out, "<title>", title, "</title>\n");
  absl::StrAppendFormat(&out, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">%s</text>\n", kLeft,
                        title);
  absl::StrAppendFormat(
      &out, "<text x=\"%.0f\" y=\"42\">%s</text>\n", kLeft,
      EscapeXml(absl::StrFormat("%s per GPU; budget %s (gpu_memory_utilization %g); KV cache %s "
                                "tokens",
                                FormatBytes(plan.total_bytes), FormatBytes(plan.budget_bytes),
                                plan.config.gpu_memory_utilization(), Thousands(plan.KvTokens()))));
  double x = kLeft;
  for (const Segment& s : segments) {
    const double width = kBarWidth * static_cast<double>(s.bytes) / plan.total_bytes;
    if (s.bytes > 0) {
      absl::StrAppendFormat(&out,
                            "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" "
                            "fill=\"%s\" stroke=\"#666666\" stroke-width=\"0.5\"><title>%s: "
                            "%s</title></rect>\n",
                            x, kBarTop, width, kBarHeight, s.color, EscapeXml(s.name),
                            EscapeXml(absl::StrCat(FormatBytes(s.bytes), ", ", s.explanation)));
    }
    x += width;
  }
  double y = kBarTop + kBarHeight + 24;
  for (const Segment& s : segments) {
    absl::StrAppendFormat(&out,
                          "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\" "
                          "stroke=\"#666666\" stroke-width=\"0.5\"/>\n",
                          kLeft, y - 10, s.color);
    absl::StrAppendFormat(&out, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", kLeft + 18, y,
                          EscapeXml(s.name));
    absl::StrAppendFormat(&out, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%s</text>\n",
                          kLeft + 250, y, FormatBytes(s.bytes));
    absl::StrAppendFormat(&out, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.1f%%</text>\n",
                          kLeft + 310, y, Share(s.bytes, plan.total_bytes));
    absl::StrAppendFormat(&out, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#444444\">%s</text>\n",
                          kLeft + 325, y, EscapeXml(s.explanation));
    y += kRow;
  }
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

}  // namespace kiln
