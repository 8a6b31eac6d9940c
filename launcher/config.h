// Training configs: YAML files plus `--set section.key=value` overrides,
// checked against one table of known keys (launcher/config.cpp), so an unknown
// key, a wrong type or an impossible batch split is an error naming the key.
#pragma once

#include <string>
#include <vector>

#include "runtime/train/config.h"

namespace bt::launcher {

/// Reads `path` (empty = the embedded default: the `tiny` preset on the
/// jargon corpus), applies `overrides` ("train.lr=3e-4", later ones win) and
/// validates for `world` ranks. model.preset picks the model defaults before
/// any other model.* key applies.
train::TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides,
                                     int world = 1);

/// The resolved config as JSON (every key, plus model.padded_vocab and
/// train.grad_accum), as read by bench/gpt2_ref.py.
std::string config_to_json(const train::TrainConfig& c, int world = 1);

/// The config as a YAML file that load_train_config reads back to the same
/// values: every key spelled out (what the job renderers embed).
std::string config_to_yaml(const train::TrainConfig& c);

/// One line per key: name, type, default (for `blutrain train --help`).
std::string config_keys_help();

}  // namespace bt::launcher
