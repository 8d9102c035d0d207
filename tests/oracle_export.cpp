// Writes the float64 oracle's inputs, reference outputs and tolerances for a few problems of every
// (op, dtype signature) as JSON, so that the Python tests check the Python package against the very
// values and tolerances the C++ tests use. Usage: oracle_export FILE.json
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "harness/checker.hpp"
#include "gradops/schema.hpp"
#include "gradops/types.hpp"

namespace {

using namespace gradops;

void number(std::FILE* f, double v) {
  if (std::isnan(v)) std::fputs("NaN", f);  // Python's json reads NaN and Infinity
  else if (std::isinf(v)) std::fputs(v > 0 ? "Infinity" : "-Infinity", f);
  else std::fprintf(f, "%.17g", v);
}

void tensor(std::FILE* f, const std::optional<oracle::Tensor>& t, DType dt) {
  if (!t) {
    std::fputs("null", f);
    return;
  }
  std::fprintf(f, "{\"dtype\":\"%s\",\"shape\":[", dtype_name(dt));
  for (std::size_t i = 0; i < t->shape.size(); ++i) std::fprintf(f, "%s%lld", i ? "," : "", static_cast<long long>(t->shape[i]));
  std::fputs("],\"values\":[", f);
  for (std::size_t i = 0; i < t->v.size(); ++i) {
    if (i) std::fputc(',', f);
    number(f, t->v[i]);
  }
  std::fputs("]}", f);
}

// One plain problem and one with a non-default attribute or layout per family.
std::vector<std::pair<std::vector<int64_t>, oracle::Attrs>> variants(const OpSchema& op) {
  switch (op.family) {
    case OpFamily::activation:
      if (op.find_attribute("alpha") >= 0) return {{{3, 5, 7}, {}}, {{9, 31}, {{"alpha", 0.5}}}};
      return {{{3, 5, 7}, {}}, {{1}, {}}};
    case OpFamily::softmax: return {{{4, 6, 9}, {}}, {{4, 6, 9}, {{"axis", 0}}}};
    case OpFamily::layer_norm: return {{{7, 33}, {}}, {{4, 6, 9}, {{"axis", 1}}}};
    case OpFamily::batch_norm: {
      if (op.find_attribute("momentum") >= 0)
        return {{{2, 3, 5, 7}, {}}, {{2, 5, 7, 3}, {{"channels_last", 1}, {"epsilon", 1e-2}, {"momentum", 0.5}}}};
      return {{{2, 3, 5, 7}, {}}, {{2, 5, 7, 3}, {{"channels_last", 1}}}};
    }
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: oracle_export FILE.json\n");
    return 2;
  }
  std::FILE* f = std::fopen(argv[1], "w");
  if (!f) {
    std::perror(argv[1]);
    return 1;
  }
  std::fputs("[\n", f);
  bool first = true;
  int cases = 0;
  for (const OpSchema& op : op_schemas()) {
    for (const TypeSignature& sig : op.signatures) {
      for (const auto& [shape, attrs] : variants(op)) {
        check::Problem p;
        p.op = op.id;
        p.sig = sig;
        p.shape = shape;
        for (const auto& [k, v] : attrs)
          if (op.find_attribute(k) >= 0) p.attrs[k] = v;
        for (const AttrSchema& a : op.attributes)  // required ones are given, as a caller must
          if (a.required && !p.attrs.count(std::string(a.name))) p.attrs[std::string(a.name)] = 1e-5;
        p.seed = 17 + static_cast<uint64_t>(cases);
        const oracle::Attrs full = check::full_attrs(p);
        std::vector<DType> in_types;
        for (std::size_t i = 0; i < op.inputs.size(); ++i) in_types.push_back(check::input_dtype(p, static_cast<int>(i)));
        oracle::Tensors inputs, expected;
        try {
          oracle::Rng rng(p.seed);
          inputs = oracle::make_inputs(op.name, p.shape, full, in_types, rng);
          expected = oracle::reference(op.name, inputs, full);
        } catch (const std::exception& e) {  // an op the oracle does not know: the tests say so
          std::fprintf(stderr, "oracle_export: %s: %s\n", check::describe(p).c_str(), e.what());
          continue;
        }
        std::fprintf(f, "%s{\"op\":\"%.*s\",\"case\":\"%s\",\"attributes\":{", first ? "" : ",\n",
                     static_cast<int>(op.name.size()), op.name.data(), check::describe(p).c_str());
        first = false;
        bool first_attr = true;
        for (const auto& [k, v] : p.attrs) {
          std::fprintf(f, "%s\"%s\":", first_attr ? "" : ",", k.c_str());
          number(f, v);
          first_attr = false;
        }
        std::fputs("},\"inputs\":[", f);
        for (std::size_t i = 0; i < op.inputs.size(); ++i) {
          if (i) std::fputc(',', f);
          tensor(f, i < inputs.size() ? inputs[i] : std::nullopt, in_types[i]);
        }
        std::fputs("],\"outputs\":[", f);
        for (std::size_t o = 0; o < op.outputs.size(); ++o) {
          if (o) std::fputc(',', f);
          const bool have = o < expected.size() && expected[o].has_value();
          if (!have) {
            std::fputs("null", f);
            continue;
          }
          const check::Tolerance tol = check::tolerance(p, static_cast<int>(o));
          std::fputs("{\"tensor\":", f);
          tensor(f, expected[o], check::output_dtype(p, static_cast<int>(o)));
          std::fputs(",\"abs\":", f);
          number(f, tol.abs);
          std::fputs(",\"rel\":", f);
          number(f, tol.rel);
          std::fputc('}', f);
        }
        std::fputs("]}", f);
        ++cases;
      }
    }
  }
  std::fputs("\n]\n", f);
  std::fclose(f);
  std::printf("oracle_export: %d cases in %s\n", cases, argv[1]);
  return 0;
}
