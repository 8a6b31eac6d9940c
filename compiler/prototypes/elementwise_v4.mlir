// The CUDA template's first shape, checked by hand with MLIR 19's tools on
// the development machine (no GPU needed): an elementwise kernel over
// 16-byte vectors (vector<4xf32> memrefs), one vector per thread, that
// lowers to PTX with ld.global.v4.f32 / st.global.v4.f32 and libdevice's
// tanhf inlined. docs/compiler.md ("Not built yet") has the pipeline; the
// compiler does not emit this yet.
//
// RUN: mlir-opt-19 %s --pass-pipeline="builtin.module(nvvm-attach-target{chip=sm_90 O=3}, gpu.module(convert-scf-to-cf, convert-gpu-to-nvvm{index-bitwidth=64}, reconcile-unrealized-casts), gpu-module-to-binary{format=isa})"
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @axpy(%x: memref<?xvector<4xf32>>, %y: memref<?xvector<4xf32>>, %out: memref<?xvector<4xf32>>, %n: index) kernel {
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %tid = gpu.thread_id x
      %t0 = arith.muli %bid, %bdim : index
      %i = arith.addi %t0, %tid : index
      %in = arith.cmpi ult, %i, %n : index
      scf.if %in {
        %a = memref.load %x[%i] : memref<?xvector<4xf32>>
        %b = memref.load %y[%i] : memref<?xvector<4xf32>>
        %c = arith.addf %a, %b : vector<4xf32>
        %h = arith.constant dense<0.5> : vector<4xf32>
        %d = arith.mulf %c, %h : vector<4xf32>
        %e = math.tanh %d : vector<4xf32>
        memref.store %e, %out[%i] : memref<?xvector<4xf32>>
      }
      gpu.return
    }
  }
}
