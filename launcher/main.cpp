// The `blutrain` executable: one binary, subcommands.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "kernels/common/error.h"
#include "launcher/commands.h"
#include "runtime/dist/world.h"

namespace {

void usage() {
  std::printf(
      "usage: blutrain <command> [options]\n\n"
      "commands:\n"
      "  train     train a model (GPT-2, Llama) on token shards (no --config: the embedded tiny default)\n"
      "  sample    sample text from a weights file written by train\n"
      "  tokenize  GPT-2-tokenize text files into llm.c token shards (PREFIX_{val,train}_*.bin)\n"
      "  bench     training throughput and memory vs the PyTorch reference, side by side\n"
      "  launch    start N ranks of a command through mpirun (launch --nproc N -- train ...)\n"
      "  ckpt      list, inspect, verify or export checkpoints (ckpt ls|inspect|verify|export)\n"
      "  slurm     render or submit the sbatch script of a job spec (slurm render|submit JOBSPEC)\n"
      "  k8s       render the Kubernetes manifests of a job spec (k8s render JOBSPEC)\n"
      "  info      show the build (CUDA, MPI, MLIR) and the devices found\n"
      "  version   print the version\n\n"
      "Run `blutrain <command> --help` for a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "train") return bt::launcher::run_train(argc - 1, argv + 1);
    if (cmd == "sample") return bt::launcher::run_sample(argc - 1, argv + 1);
    if (cmd == "tokenize") return bt::launcher::run_tokenize(argc - 1, argv + 1);
    if (cmd == "bench") return bt::launcher::run_bench(argc - 1, argv + 1);
    if (cmd == "launch") return bt::launcher::run_launch(argc - 1, argv + 1);
    if (cmd == "ckpt") return bt::launcher::run_ckpt(argc - 1, argv + 1);
    if (cmd == "slurm") return bt::launcher::run_slurm(argc - 1, argv + 1);
    if (cmd == "k8s") return bt::launcher::run_k8s(argc - 1, argv + 1);
    if (cmd == "info") return bt::launcher::run_info(argc - 1, argv + 1);
    if (cmd == "version" || cmd == "--version") {
      std::printf("blutrain %s\n", bt::launcher::version());
      return 0;
    }
    std::fprintf(stderr, "blutrain: unknown command '%s'\n\n", cmd.c_str());
    usage();
    return 2;
  } catch (const std::exception& e) {
    const bt::dist::World& w = bt::dist::world();
    if (w.distributed()) {
      // Other ranks may be waiting on this one: end the whole job.
      std::fprintf(stderr, "blutrain %s: error on rank %d of %d: %s\n", cmd.c_str(), w.rank, w.size,
                   e.what());
      bt::dist::abort_world(1);
    }
    std::fprintf(stderr, "blutrain %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
