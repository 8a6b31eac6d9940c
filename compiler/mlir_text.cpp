#include "compiler/mlir_text.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "kernels/common/error.h"

namespace bt::compiler {

const char* mlir_type(DType t) {
  BT_CHECK(t == DType::F32 || t == DType::F64 || t == DType::BF16,
           "fusion groups compute in f32, f64 or bf16, not ", dtype_name(t));
  return dtype_name(t).data();
}

std::string constant_bits(double value, DType t) {
  char buf[32];
  if (t == DType::F64) {
    uint64_t u;
    std::memcpy(&u, &value, 8);
    std::snprintf(buf, sizeof buf, "0x%016" PRIX64, u);
  } else {
    const float f = static_cast<float>(value);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (t == DType::BF16)
      std::snprintf(buf, sizeof buf, "0x%04X", static_cast<unsigned>(float_to_bf16_bits(f)));
    else
      std::snprintf(buf, sizeof buf, "0x%08X", static_cast<unsigned>(u));
  }
  return buf;
}

std::string elementwise_op(fusion::Op op, const std::string& result, const std::vector<std::string>& args,
                           const std::string& type) {
  using fusion::Op;
  switch (op) {
    case Op::Neg:
      return result + " = arith.negf " + args.at(0) + " : " + type;
    case Op::Exp:
    case Op::Log:
    case Op::Tanh:
    case Op::Sqrt:
      return result + " = math." + fusion::op_name(op) + " " + args.at(0) + " : " + type;
    case Op::Pow:
      return result + " = math.powf " + args.at(0) + ", " + args.at(1) + " : " + type;
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div: {
      const char* f = op == Op::Add ? "addf" : op == Op::Sub ? "subf" : op == Op::Mul ? "mulf" : "divf";
      return result + " = arith." + f + " " + args.at(0) + ", " + args.at(1) + " : " + type;
    }
    default:
      BT_ASSERT(false, "elementwise_op: ", fusion::op_name(op), " is not elementwise");
  }
  return {};
}

}  // namespace bt::compiler
