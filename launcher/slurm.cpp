// `blutrain slurm render JOBSPEC [-o FILE]` prints (or writes) the sbatch
// script of a job spec; `blutrain slurm submit JOBSPEC [--script FILE]`
// writes it and hands it to sbatch. The script's behaviour (requeue on
// preemption and failure, bounded by max_restarts; resume from `latest`) is
// described in slurm/README.md.
#include <array>
#include <cstdio>
#include <string>

#include <sys/stat.h>
#include <sys/wait.h>

#include "kernels/common/error.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/jobspec.h"
#include "launcher/slurm_script.h"
#include "launcher/text_file.h"

namespace bt::launcher {
namespace {

void write_script(const std::string& path, const std::string& text) {
  write_text_file(path, text, "the sbatch script");
  ::chmod(path.c_str(), 0755);
}

/// Runs `cmd` through the shell; returns its exit status and output.
std::pair<int, std::string> run_shell(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  BT_CHECK(p != nullptr, "cannot run '", cmd, "'");
  std::string out;
  std::array<char, 4096> buf{};
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

}  // namespace

int run_slurm(int argc, char** argv) {
  cli::Options opts("blutrain slurm",
                    "Run a job spec on Slurm.\n"
                    "  blutrain slurm render JOBSPEC [-o FILE]    print or write the sbatch script\n"
                    "  blutrain slurm submit JOBSPEC [--script FILE] [--sbatch PATH]\n"
                    "                                             write it and submit it with sbatch");
  opts.add_options()("o,output", "render: write the script here instead of printing it",
                     cli::value<std::string>())(
      "script", "submit: where the script is written (default: NAME.sbatch in this folder)",
      cli::value<std::string>())("sbatch", "submit: the sbatch to run",
                                 cli::value<std::string>()->default_value("sbatch"))(
      "h,help", "show this help")("positional", "", cli::value<std::vector<std::string>>());
  opts.parse_positional({"positional"});
  cli::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    BT_FAIL(e.what(), " (see blutrain slurm --help)");
  }
  const std::vector<std::string> pos =
      r.count("positional") ? r["positional"].as<std::vector<std::string>>() : std::vector<std::string>{};
  if (r.count("help") || pos.empty()) {
    std::printf("%s\nThe job spec format: docs/jobspec.md; the script: slurm/README.md.\n",
                opts.help().c_str());
    return pos.empty() && !r.count("help") ? 2 : 0;
  }
  BT_CHECK(pos.size() == 2 && (pos[0] == "render" || pos[0] == "submit"),
           "usage: blutrain slurm render|submit JOBSPEC (see blutrain slurm --help)");
  const JobSpec spec = load_job_spec(pos[1]);
  const std::string split = spec.train.batch_split_note(static_cast<int>(spec.world()));
  if (!split.empty()) std::fprintf(stderr, "blutrain slurm: %s: note: %s\n", pos[1].c_str(), split.c_str());
  const std::string text = render_sbatch(spec);
  if (pos[0] == "render") {
    if (r.count("output")) {
      write_script(r["output"].as<std::string>(), text);
      std::fprintf(stderr, "wrote %s (%lld rank(s) on %lld node(s)); submit it with sbatch\n",
                   r["output"].as<std::string>().c_str(), static_cast<long long>(spec.world()),
                   static_cast<long long>(spec.nodes));
    } else {
      std::fputs(text.c_str(), stdout);
    }
    return 0;
  }
  const std::string script = r.count("script") ? r["script"].as<std::string>() : spec.name + ".sbatch";
  write_script(script, text);
  const auto [status, out] =
      run_shell(shell_quote(r["sbatch"].as<std::string>()) + " --parsable " + shell_quote(script));
  BT_CHECK(status == 0, "sbatch refused '", script, "' (exit status ", status, "): ", out,
           status == 127 ? " (is Slurm installed here? pass --sbatch PATH)" : "");
  const std::string id = out.substr(0, out.find_first_of(";\n"));
  std::printf("submitted job %s (%s: %lld rank(s) on %lld node(s)), script %s\n", id.c_str(),
              spec.name.c_str(), static_cast<long long>(spec.world()), static_cast<long long>(spec.nodes),
              script.c_str());
  std::printf("  follow it: squeue -j %s; its output: %s; checkpoints: %s\n", id.c_str(),
              spec.slurm.output.c_str(), spec.checkpoint_dir.c_str());
  return 0;
}

}  // namespace bt::launcher
