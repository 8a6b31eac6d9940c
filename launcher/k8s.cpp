// `blutrain k8s render JOBSPEC [--mode indexed|mpijob] [-o FILE]` prints (or
// writes) the Kubernetes manifests of a job spec (launcher/k8s_manifests.h),
// ready for `kubectl apply -f`. What they do on failure and preemption is in
// k8s/README.md.
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/jobspec.h"
#include "launcher/k8s_manifests.h"
#include "launcher/text_file.h"

namespace bt::launcher {

int run_k8s(int argc, char** argv) {
  cli::Options opts(
      "blutrain k8s",
      "Run a job spec on Kubernetes.\n"
      "  blutrain k8s render JOBSPEC [--mode indexed|mpijob] [-o FILE]\n"
      "      print or write the manifests: a ConfigMap with the training config, a\n"
      "      PersistentVolumeClaim for checkpoints (unless k8s.existing_claim), and\n"
      "        indexed: a headless Service and an Indexed Job, one pod (and GPU) per rank\n"
      "        mpijob:  a Kubeflow MPIJob (mpi-operator v2beta1), one worker pod per node\n"
      "  Apply them with `blutrain k8s render spec.yaml | kubectl apply -f -`; see k8s/README.md.");
  opts.add_options()("mode", "indexed or mpijob", cli::value<std::string>()->default_value("indexed"))(
      "o,output", "write the manifests here instead of printing them", cli::value<std::string>())(
      "h,help", "show this help")("positional", "", cli::value<std::vector<std::string>>());
  opts.parse_positional({"positional"});
  opts.positional_help("render JOBSPEC");
  cli::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    BT_FAIL(e.what(), " (see blutrain k8s --help)");
  }
  const std::vector<std::string> a =
      r.count("positional") ? r["positional"].as<std::vector<std::string>>() : std::vector<std::string>{};
  if (r.count("help") || a.empty()) {
    std::printf("%s\n", opts.help().c_str());
    return a.empty() && !r.count("help") ? 2 : 0;
  }
  BT_CHECK(a[0] == "render", "blutrain k8s: unknown verb '", a[0], "'; use render (see blutrain k8s --help)");
  BT_CHECK(a.size() == 2, "blutrain k8s render: expected one job spec, got ", a.size() - 1,
           " argument(s) (see blutrain k8s --help)");
  const K8sMode mode = parse_k8s_mode(r["mode"].as<std::string>(), "blutrain k8s render --mode");
  const JobSpec spec = load_job_spec(a[1]);
  const std::string split = spec.train.batch_split_note(static_cast<int>(spec.world()));
  if (!split.empty()) std::fprintf(stderr, "blutrain k8s: %s: note: %s\n", a[1].c_str(), split.c_str());
  const std::string text = render_k8s(spec, mode);
  if (!r.count("output")) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  const std::string out = r["output"].as<std::string>();
  // An Indexed Job's manifests hold its job token (a Secret): the file is the owner's only.
  const bool secret = mode == K8sMode::indexed;
  write_text_file(out, text, "the manifests", secret);
  std::fprintf(stderr, "wrote %s (%s%s)\n", out.c_str(), r["mode"].as<std::string>().c_str(),
               secret ? "; it holds the job's token, so only you can read it" : "");
  return 0;
}

}  // namespace bt::launcher
