// Renders a MemoryPlan for people and programs: a text table, JSON, a textproto, an SVG bar.
//
//   ASSIGN_OR_RETURN(kiln::MemoryPlan plan, kiln::PlanMemory(config));
//   std::cout << kiln::RenderTable(plan, /*context_tokens=*/8192);
//   WriteFile("plan.svg", kiln::RenderSvg(plan));
//
// Every output is a pure function of the plan (no clock, no locale), so it can be compared with
// a golden file. Thread-safe.
#ifndef KILN_TOOLS_MEMORY_PLANNER_OUTPUT_H_
#define KILN_TOOLS_MEMORY_PLANNER_OUTPUT_H_

#include <cstdint>
#include <string>

#include "runtime/memory/memory_planner.h"
#include "tools/memory_planner_report.pb.h"

namespace kiln {

// Returns the plan as a report message, with the concurrency at `context_tokens`.
tools::MemoryPlanReport ToReport(const MemoryPlan& plan, int64_t context_tokens);

// Returns a readable table: a header (model, GPU, budget, graphs), one row per term (name, size,
// share of the budget, explanation), then the KV cache and the concurrency at `context_tokens`.
std::string RenderTable(const MemoryPlan& plan, int64_t context_tokens);

// Returns ToReport(...) as JSON (snake_case names; 64-bit integers as strings, per proto3).
std::string RenderJson(const MemoryPlan& plan, int64_t context_tokens);

// Returns ToReport(...) as a textproto.
std::string RenderTextProto(const MemoryPlan& plan, int64_t context_tokens);

// Returns a standalone SVG: the GPU's memory as one stacked bar (each term, then what lies
// outside the budget), with a legend of sizes and shares.
std::string RenderSvg(const MemoryPlan& plan);

}  // namespace kiln

#endif  // KILN_TOOLS_MEMORY_PLANNER_OUTPUT_H_
