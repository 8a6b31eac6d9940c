// The `blutrain` executable: one binary, subcommands.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "kernels/common/error.h"
#include "launcher/commands.h"

namespace {

void usage() {
  std::printf(
      "usage: blutrain <command> [options]\n\n"
      "commands:\n"
      "  demo      train a small character-level GPT on a text file and print a sample\n"
      "  info      show the build (CUDA, MPI, MLIR) and the devices found\n"
      "  version   print the version\n\n"
      "Run `blutrain <command> --help` for a command's options.\n"
      "(train, launch, tokenize, sample, bench, ckpt, slurm and k8s arrive with later milestones)\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "demo") return bt::launcher::run_demo(argc - 1, argv + 1);
    if (cmd == "info") return bt::launcher::run_info(argc - 1, argv + 1);
    if (cmd == "version" || cmd == "--version") {
      std::printf("blutrain %s\n", bt::launcher::version());
      return 0;
    }
    std::fprintf(stderr, "blutrain: unknown command '%s'\n\n", cmd.c_str());
    usage();
    return 2;
  } catch (const bt::Error& e) {
    std::fprintf(stderr, "blutrain %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "blutrain %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
