// The public runtime API in one include.
#pragma once

#include "runtime/autograd/grad_mode.h"
#include "runtime/core/device.h"
#include "runtime/core/precision.h"
#include "runtime/core/stream.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/cross_entropy.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/gelu.h"
#include "runtime/ops/layernorm.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/softmax.h"
#include "runtime/optim/adamw.h"
#include "runtime/tensor/factory.h"
#include "runtime/tensor/tensor.h"
