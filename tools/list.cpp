// gradops list: the op table as ONNX Runtime users read it.
#include <cstdio>
#include <string>
#include <vector>

#include "cli.hpp"

namespace gradops::cli {
namespace {

std::string arg_list(const OpSchema& op, std::span<const ArgSchema> args) {
  std::string s;
  for (const ArgSchema& a : args) {
    if (!s.empty()) s += ", ";
    s += std::string(a.name) + ": " + std::string(op.type_vars[a.type_var]);
    if (a.optional || a.extension)
      s += std::string(" (") + (a.optional ? "optional" : "") + (a.optional && a.extension ? ", " : "") +
           (a.extension ? "gradops extension" : "") + ")";
  }
  return s;
}

std::string number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

std::string attribute_list(const OpSchema& op) {
  if (op.attributes.empty()) return "none";
  std::string s;
  for (const AttrSchema& a : op.attributes) {
    if (!s.empty()) s += ", ";
    s += std::string(a.name) + ": " + (a.type == AttrType::int64 ? "int" : "float");
    s += a.required ? " (required)" : " = " + number(a.default_value);
    if (a.extension) s += " (gradops extension)";
  }
  return s;
}

void print_op(const OpSchema& op) {
  std::printf("%s  %s v%d  %s, %s family%s\n", std::string(op.name).c_str(),
              op.domain.empty() ? "ai.onnx" : std::string(op.domain).c_str(), op.since_version,
              op.gradient ? "gradient" : "forward", op_family_name(op.family),
              op.origin == OpOrigin::gradops ? ", gradops' own (not an ONNX Runtime operator)" : "");
  std::printf("  %s\n", std::string(op.summary).c_str());
  std::printf("  inputs:     %s\n", arg_list(op, op.inputs).c_str());
  std::printf("  outputs:    %s\n", arg_list(op, op.outputs).c_str());
  std::printf("  attributes: %s\n", attribute_list(op).c_str());
  std::string vars;
  for (std::size_t v = 0; v < op.type_vars.size(); ++v) vars.append(v ? ", " : "").append(op.type_vars[v]);
  std::string sigs;
  const bool several = op.type_vars.size() > 1;
  for (const TypeSignature& s : op.signatures) {
    if (!sigs.empty()) sigs += ' ';
    if (several) sigs += '(';
    for (std::size_t v = 0; v < op.type_vars.size(); ++v) sigs.append(v ? ", " : "").append(dtype_name(s.types[v]));
    if (several) sigs += ')';
  }
  std::printf("  dtypes (%s): %s\n", vars.c_str(), sigs.c_str());
  for (const AliasRule& r : op.aliases)
    std::printf("  in place:   %s may be the same buffer as %s\n", std::string(op.outputs[r.output].name).c_str(),
                std::string(op.inputs[r.input].name).c_str());
  // Per device type, what this build runs: the signatures it has kernels for, and the
  // implementation rows that dispatch tries (in order) for them.
  for (DeviceType device : {DeviceType::cpu, DeviceType::cuda}) {
    std::string have, rows;
    std::size_t count = 0;
    for (const TypeSignature& s : op.signatures) {
      const std::vector<std::string> names = implementations(op.id, s, device);
      if (names.empty()) continue;
      ++count;
      if (!have.empty()) have += ' ';
      if (several) have += '(';
      for (std::size_t v = 0; v < op.type_vars.size(); ++v) have.append(v ? ", " : "").append(dtype_name(s.types[v]));
      if (several) have += ')';
      for (const std::string& n : names)
        if (rows.find(n) == std::string::npos) rows += (rows.empty() ? "" : ", ") + n;
    }
    const std::string label = std::string(device_type_name(device)) + ":";
    if (count == 0)
      std::printf("  %-11s not implemented in this build\n", label.c_str());
    else
      std::printf("  %-11s %s; %s\n", label.c_str(), count == op.signatures.size() ? "every signature" : have.c_str(),
                  rows.c_str());
  }
}

}  // namespace

int list_main(std::span<char* const> args) {
  CLI::App app{
      "Every operator with its ONNX Runtime signature: domain, inputs and outputs with their\n"
      "type variables (optional ones and gradops extensions marked), attributes with types and\n"
      "defaults (required ones marked), the dtype signatures, in-place pairs; and the devices\n"
      "this build runs them on."};
  std::vector<std::string> op_values;
  app.add_option("--op", op_values, "only these operators (ORT names, comma-separated; repeatable)")
      ->type_name("NAMES")
      ->allow_extra_args(false);
  if (const int rc = parse_args(app, "list", args); rc >= 0) return rc;
  std::string error;
  Selection sel;
  if (!sel.parse(op_values, {}, &error)) return usage_error("list", error);

  // gradops' own operators (the BatchNorm split) are counted apart: they are halves of ORT's
  // operators, not gradients or forwards of their own.
  int gradients = 0, forwards = 0, own = 0;
  for (const OpSchema& op : op_schemas())
    (op.origin == OpOrigin::gradops ? own : op.gradient ? gradients : forwards)++;
  std::printf("gradops %s: %d operators (%d gradients, %d forward companions, %d of gradops' own)\n",
              GRADOPS_VERSION, gradients + forwards + own, gradients, forwards, own);
  forwards += own;
  for (DeviceType device : {DeviceType::cpu, DeviceType::cuda}) {
    int ops = 0;
    for (const OpSchema& op : op_schemas()) ops += supports(op.id, device);
    std::printf("%s: %d of %d operators implemented in this build%s\n", device_type_name(device), ops,
                gradients + forwards,
#if defined(GRADOPS_HAVE_CUDA)
                ""
#else
                device == DeviceType::cuda ? " (built without CUDA)" : ""
#endif
    );
  }
  bool first_forward = true, first_own = true;
  for (const OpSchema& op : op_schemas()) {
    if (!sel.op_selected(op)) continue;
    if (!op.gradient && first_forward && sel.ops.empty()) {
      std::printf("\n---- forward companions ----\n");
      first_forward = false;
    }
    if (op.origin == OpOrigin::gradops && first_own && sel.ops.empty()) {
      std::printf("\n---- gradops' own: the BatchNorm split for data-parallel callers ----\n");
      first_own = false;
    }
    std::printf("\n");
    print_op(op);
  }
  return kExitOk;
}

}  // namespace gradops::cli
