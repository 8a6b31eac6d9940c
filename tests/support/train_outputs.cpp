#include "tests/support/train_outputs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

namespace bt::test {

std::vector<nlohmann::json> jsonl_rows(const std::string& path) {
  std::vector<nlohmann::json> v;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) v.push_back(nlohmann::json::parse(line));
  return v;
}

std::vector<double> losses(const std::string& jsonl) {
  std::vector<double> v;
  for (const nlohmann::json& row : jsonl_rows(jsonl)) v.push_back(row.at("loss").get<double>());
  return v;
}

std::map<int64_t, double> losses_by_step(const std::string& jsonl) {
  std::map<int64_t, double> m;
  for (const nlohmann::json& row : jsonl_rows(jsonl))
    m[row.at("step").get<int64_t>()] = row.at("loss").get<double>();
  return m;
}

WeightDiff weight_diff(const std::vector<std::pair<std::string, Tensor>>& x,
                       const std::vector<std::pair<std::string, Tensor>>& ref) {
  WeightDiff d;
  double num_all = 0, den_all = 0;
  d.identical = x.size() == ref.size();
  for (size_t k = 0; k < std::min(x.size(), ref.size()); ++k) {
    const std::vector<float> a = x[k].second.to_vector<float>(), b = ref[k].second.to_vector<float>();
    d.identical = d.identical && a.size() == b.size() &&
                  (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    double num = 0, den = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    num_all += num;
    den_all += den;
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    if (rel > d.worst) d.worst = rel, d.where = x[k].first;
  }
  d.all = std::sqrt(num_all / std::max(den_all, 1e-30));
  return d;
}

}  // namespace bt::test
