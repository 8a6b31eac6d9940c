// Stop requests: a signal that asks a training job to save a checkpoint and
// stop, so that it can be restarted from there (Slurm preemption and time
// limits, Kubernetes evictions, `blutrain launch` shutting a job down).
//
// Note [Stop requests]: SIGUSR1 (what the rendered sbatch script asks Slurm to
// send ahead of a preemption or the time limit) and SIGTERM (Kubernetes,
// scancel, a requeue) only set a flag. After each step every rank all-reduces
// the flag, so all ranks stop after the same step even when the signal reached
// them at different moments, or reached only one of them. They save a
// checkpoint there and exit with kExitStopped; the Slurm script, the
// Kubernetes Job and `blutrain launch --max-restarts` read that status as
// "checkpoint saved, restart me". A second SIGTERM or a SIGINT ends the
// process at once, as usual.
#pragma once

#include <string>

#include "runtime/dist/world.h"

namespace bt::launcher {

/// EX_TEMPFAIL: stopped on request after saving a checkpoint.
constexpr int kExitStopped = 75;

/// Installs the SIGUSR1 and SIGTERM handlers (a job with checkpoint.dir).
void install_stop_handlers();

/// "SIGUSR1", "SIGTERM", or "another rank's signal" when none reached this one.
std::string stop_signal_name();

/// Collective over `w` (through dist::cpu_group() when there are several
/// ranks): whether any rank has been asked to stop.
bool stop_agreed(const dist::World& w);

}  // namespace bt::launcher
