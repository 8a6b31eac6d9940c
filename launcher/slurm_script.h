// The sbatch script of a job spec: slurm/blutrain.sbatch.in (compiled into the
// binary) with the spec's #SBATCH lines, environment, resolved training config
// and launch line filled in. What the script does on preemption, at the time
// limit and after a failure is described in slurm/README.md.
#pragma once

#include <string>

#include "launcher/jobspec.h"

namespace bt::launcher {

/// The whole script, ready for sbatch.
std::string render_sbatch(const JobSpec& s);

/// `s` quoted for bash (single quotes unless it needs none).
std::string shell_quote(const std::string& s);

}  // namespace bt::launcher
