// Weight-exchange files: one HDF5 file holding a model's parameters by name, the
// format BluTrain and the PyTorch reference (bench/gpt2_ref.py) share for
// fidelity tests (`blutrain train --save-init / --save-weights / --init`).
//
// Format "blutrain-weights", version 1:
//   - one float32 dataset per parameter in the root group, named exactly as the
//     parameter ("h.0.attn.c_attn.weight": dots are part of the name, there are
//     no subgroups), with exactly the parameter's shape (Linear weights [out, in]),
//     under that one name: no soft or hard links (Note [Each tensor under one
//     name] in weights_read.cpp);
//   - root attributes: string `format` = "blutrain-weights", int64 `version` = 1,
//     and int64 scalars describing the model (n_layer, n_head, n_embd, seq_len,
//     vocab_size, padded_vocab for GPT-2);
//   - string root attributes: `model`, the model's config as JSON
//     (nn::model_config_json: arch, every model key) since model.arch;
//   - the root group tracks link creation order, so readers list the datasets in
//     the order they were written (h5py: File(..., track_order=True)).
// Files are written to PATH.tmp and renamed, so a reader never sees a partial
// file and a failed save leaves an existing PATH untouched.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/weights_read.h"
#include "runtime/tensor/tensor.h"

namespace bt {

/// The contents of a weights file.
struct WeightFile {
  /// Where it was read from (for error messages).
  std::string path;
  /// The int64 root attributes other than `format` and `version` (those two are
  /// validated by load_weights and not repeated here).
  std::map<std::string, int64_t> attrs;
  /// The string root attributes other than `format` (`model`: the config as JSON).
  std::map<std::string, std::string> text_attrs;
  /// Contiguous CPU f32 tensors, in file order: the order they were written when
  /// the file tracks creation order (save_weights and gpt2_ref.py files do), else
  /// name order.
  std::vector<std::pair<std::string, Tensor>> tensors;

  /// The tensor called `name`, or nullptr.
  const Tensor* find(const std::string& name) const;
};

/// Writes `named` (any device; dtype f32 or bf16, saved as f32), `attrs` (int64
/// scalar root attributes; `format` and `version` are added and may not be given)
/// and `text` (string scalar root attributes)
/// to `path`, atomically: it writes `path + ".tmp"`, fsyncs it and renames it over
/// `path`. Throws bt::Error for an empty, duplicate or '/'-containing name, another
/// dtype, a missing parent directory or any HDF5/IO failure; on failure `path` is
/// left as it was and the temporary file is removed.
void save_weights(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& named,
                  const std::map<std::string, int64_t>& attrs,
                  const std::map<std::string, std::string>& text = {});

/// Reads a weights file. Throws bt::Error for a missing file, a file that is not
/// HDF5 (or is corrupt or truncated), a `format` other than "blutrain-weights", a
/// newer `version`, an attribute that is not an integer or string scalar (or an
/// integer an int64_t cannot hold), a root object that is not a dataset, a dataset
/// that is not float32, a shape with more elements than a tensor holds, data the
/// file does not store (Note [Only data the file holds]) or data in another file
/// (Note [Only the file we were given]). The checks are read_weight_file's.
WeightFile load_weights(const std::string& path);

/// Throws bt::Error unless every attribute in `expected` is present in `file`
/// with the same value (e.g. the model config: n_layer, n_embd, ...). Attributes
/// in the file but not in `expected` are ignored.
void check_weight_attrs(const WeightFile& file, const std::map<std::string, int64_t>& expected);

/// Copies each of `params` (any device and floating dtype; converted) from the
/// file tensor of the same name, under NoGradGuard. Everything is checked before
/// anything is copied; throws bt::Error naming the tensor for a parameter missing
/// from the file, a file tensor no parameter takes, or a shape mismatch (both
/// shapes printed).
void load_into(const WeightFile& file, const std::vector<std::pair<std::string, Tensor>>& params);

}  // namespace bt
