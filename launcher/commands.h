// Entry points of the blutrain subcommands. Each takes the arguments after
// `blutrain` (argv[0] is the command name) and returns the exit status; user
// errors are thrown as bt::Error and printed by main().
#pragma once

namespace bt::launcher {

const char* version();
int run_info(int argc, char** argv);
int run_tokenize(int argc, char** argv);
int run_train(int argc, char** argv);
int run_sample(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_launch(int argc, char** argv);
int run_ckpt(int argc, char** argv);
int run_slurm(int argc, char** argv);
int run_k8s(int argc, char** argv);

}  // namespace bt::launcher
