// `blutrain demo`: trains a small character-level GPT on a text file with the
// runtime's ops (embedding, fused layernorm, fused causal attention, linear
// with bias/GELU epilogues, fused softmax cross-entropy, fused AdamW), shows
// progress, evaluates on a held-out tail of the text and prints a sample.
// It is the README's main job until the GPT-2 trainer (`blutrain train`)
// lands; the model is a real pre-LN transformer, only small and byte-level.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

#include "launcher/cli.h"
#include "launcher/commands.h"
#include "runtime/bt.h"

namespace bt::launcher {
namespace {

struct Config {
  std::string data;
  Device device;
  int steps, batch, seq, layers, dim, heads, eval_every, sample_len;
  double lr;
  uint64_t seed;
};

struct Block {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b;
};

struct Model {
  Tensor wte, wpe, lnf_w, lnf_b;
  std::vector<Block> blocks;
  int heads = 1;

  std::vector<Tensor> matrices() const {
    std::vector<Tensor> m = {wte, wpe};
    for (const Block& b : blocks) m.insert(m.end(), {b.qkv_w, b.proj_w, b.fc_w, b.out_w});
    return m;
  }
  std::vector<Tensor> vectors() const {
    std::vector<Tensor> v = {lnf_w, lnf_b};
    for (const Block& b : blocks)
      v.insert(v.end(), {b.ln1_w, b.ln1_b, b.qkv_b, b.proj_b, b.ln2_w, b.ln2_b, b.fc_b, b.out_b});
    return v;
  }
};

/// GPT-2 style init: N(0, 0.02), residual projections scaled by 1/sqrt(2 L).
Model init_model(int vocab, const Config& c) {
  Generator g(c.seed);
  const TensorOptions o{DType::F32, c.device};
  const int64_t C = c.dim;
  auto w = [&](Shape s, double std) { return normal(s, 0.0, std, o, &g).requires_grad_(); };
  auto z = [&](Shape s) { return zeros(s, o).requires_grad_(); };
  auto one = [&](Shape s) { return ones(s, o).requires_grad_(); };
  const double proj_std = 0.02 / std::sqrt(2.0 * c.layers);
  Model m;
  m.heads = c.heads;
  m.wte = w({vocab, C}, 0.02);
  m.wpe = w({c.seq, C}, 0.02);
  for (int l = 0; l < c.layers; ++l)
    m.blocks.push_back(Block{one({C}), z({C}), w({3 * C, C}, 0.02), z({3 * C}), w({C, C}, proj_std), z({C}),
                             one({C}), z({C}), w({4 * C, C}, 0.02), z({4 * C}), w({C, 4 * C}, proj_std),
                             z({C})});
  m.lnf_w = one({C});
  m.lnf_b = z({C});
  return m;
}

/// idx: i32 [B, T] -> logits [B, T, vocab]
Tensor forward(const Model& m, const Tensor& idx) {
  const int64_t B = idx.size(0), T = idx.size(1), C = m.wte.size(1), H = m.heads;
  Tensor pos = arange(T, TensorOptions{DType::I32, idx.device()});
  Tensor x = add(embedding(m.wte, idx), embedding(m.wpe, pos));
  for (const Block& b : m.blocks) {
    Tensor qkv = linear(layer_norm(x, b.ln1_w, b.ln1_b), b.qkv_w, b.qkv_b).view({B, T, 3, H, C / H});
    auto head = [&](int i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };  // [B, H, T, D], strided
    Tensor att = causal_attention(head(0), head(1), head(2)).permute({0, 2, 1, 3}).reshape({B, T, C});
    x = add(x, linear(att, b.proj_w, b.proj_b));
    Tensor h = linear(layer_norm(x, b.ln2_w, b.ln2_b), b.fc_w, b.fc_b, Activation::Gelu);
    x = add(x, linear(h, b.out_w, b.out_b));
  }
  return linear(layer_norm(x, m.lnf_w, m.lnf_b), m.wte);  // tied LM head
}

struct Corpus {
  std::vector<int32_t> train, val;
  std::vector<unsigned char> itos;  // token id -> byte
};

Corpus load_corpus(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  BT_CHECK(f, "demo: cannot open text file '", path,
           "'; fetch the default corpus with `scripts/fetch-data jargon` "
           "or pass --data FILE");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  BT_CHECK(text.size() >= 10000, "demo: '", path, "' holds only ", text.size(),
           " bytes; give it at least 10 kB of text");
  std::vector<int> stoi(256, -1);
  Corpus c;
  for (unsigned char ch : text)
    if (stoi[ch] < 0) stoi[ch] = 0;
  for (int b = 0; b < 256; ++b)
    if (stoi[b] == 0) {
      stoi[b] = static_cast<int>(c.itos.size());
      c.itos.push_back(static_cast<unsigned char>(b));
    }
  const size_t split = text.size() * 9 / 10;
  for (size_t i = 0; i < text.size(); ++i)
    (i < split ? c.train : c.val).push_back(stoi[static_cast<unsigned char>(text[i])]);
  return c;
}

/// Random windows of T+1 tokens -> (inputs, targets), each i32 [B, T] on `d`.
std::pair<Tensor, Tensor> batch(const std::vector<int32_t>& data, int B, int T, std::mt19937_64& rng,
                                Device d) {
  std::uniform_int_distribution<size_t> pick(0, data.size() - T - 2);
  std::vector<int32_t> x(B * T), y(B * T);
  for (int b = 0; b < B; ++b) {
    const size_t s = pick(rng);
    std::copy_n(data.begin() + s, T, x.begin() + b * T);
    std::copy_n(data.begin() + s + 1, T, y.begin() + b * T);
  }
  return {from_vector<int32_t>(x, {B, T}).to(d), from_vector<int32_t>(y, {B, T}).to(d)};
}

double evaluate(const Model& m, const Corpus& c, const Config& cfg, int batches) {
  NoGradGuard ng;
  std::mt19937_64 rng(cfg.seed + 1);
  double total = 0;
  for (int i = 0; i < batches; ++i) {
    auto [x, y] = batch(c.val, cfg.batch, cfg.seq, rng, cfg.device);
    Tensor logits = forward(m, x);
    total += cross_entropy(logits.view({-1, logits.size(-1)}), y.view({-1})).item<float>();
  }
  return total / batches;
}

std::string sample(const Model& m, const Corpus& c, const Config& cfg, const std::string& prompt) {
  NoGradGuard ng;
  std::mt19937_64 rng(cfg.seed + 2);
  std::vector<int32_t> ctx;
  for (unsigned char ch : prompt) {
    auto it = std::find(c.itos.begin(), c.itos.end(), ch);
    if (it != c.itos.end()) ctx.push_back(static_cast<int32_t>(it - c.itos.begin()));
  }
  if (ctx.empty()) ctx.push_back(0);
  std::string out(prompt);
  for (int i = 0; i < cfg.sample_len; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(ctx.size()), cfg.seq);
    std::vector<int32_t> window(ctx.end() - n, ctx.end());
    Tensor logits = forward(m, from_vector<int32_t>(window, {1, n}).to(cfg.device));
    std::vector<float> last = logits.select(1, n - 1).to_vector<float>();
    const float mx = *std::max_element(last.begin(), last.end());
    std::vector<double> p(last.size());
    for (size_t k = 0; k < last.size(); ++k) p[k] = std::exp((last[k] - mx) / 0.8);  // temperature 0.8
    std::discrete_distribution<int> dist(p.begin(), p.end());
    const int next = dist(rng);
    ctx.push_back(next);
    out.push_back(static_cast<char>(c.itos[next]));
  }
  return out;
}

/// Byte-level sampling can split multi-byte UTF-8 characters; print those as '?'.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok)
      out.append(s, i, len);
    else
      out.push_back('?');
    i += ok ? len : 1;
  }
  return out;
}

Config parse(int argc, char** argv) {
  cli::Options opts("blutrain demo",
                    "Train a small character-level GPT on a text file, then sample from it.");
  opts.add_options()("data", "text file to train on",
                     cli::value<std::string>()->default_value("data/jargon/jargon.txt"))(
      "device", "auto, cpu, cuda or cuda:N", cli::value<std::string>()->default_value("auto"))(
      "steps", "training steps", cli::value<int>()->default_value("600"))(
      "batch", "sequences per step", cli::value<int>()->default_value("16"))(
      "seq", "context length", cli::value<int>()->default_value("64"))("layers", "transformer blocks",
                                                                       cli::value<int>()->default_value("2"))(
      "dim", "model width", cli::value<int>()->default_value("128"))("heads", "attention heads",
                                                                     cli::value<int>()->default_value("4"))(
      "lr", "peak learning rate", cli::value<double>()->default_value("3e-3"))(
      "eval-every", "steps between validation passes", cli::value<int>()->default_value("100"))(
      "sample-len", "characters to sample at the end", cli::value<int>()->default_value("400"))(
      "seed", "random seed", cli::value<uint64_t>()->default_value("1337"))("h,help", "show this help");
  cli::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    BT_FAIL(e.what(), " (see blutrain demo --help)");
  }
  if (r.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    std::exit(0);
  }
  Config c;
  c.data = r["data"].as<std::string>();
  const std::string dev = r["device"].as<std::string>();
  c.device = dev == "auto" ? (cuda_available() ? Device::cuda(0) : Device::cpu()) : parse_device(dev);
  check_device_usable(c.device);
  c.steps = r["steps"].as<int>();
  c.batch = r["batch"].as<int>();
  c.seq = r["seq"].as<int>();
  c.layers = r["layers"].as<int>();
  c.dim = r["dim"].as<int>();
  c.heads = r["heads"].as<int>();
  c.lr = r["lr"].as<double>();
  c.eval_every = r["eval-every"].as<int>();
  c.sample_len = r["sample-len"].as<int>();
  c.seed = r["seed"].as<uint64_t>();
  BT_CHECK(c.steps > 0 && c.batch > 0 && c.seq > 1 && c.layers > 0,
           "demo: --steps, --batch, --layers must be > 0 "
           "and --seq > 1");
  BT_CHECK(c.heads > 0 && c.dim % c.heads == 0, "demo: --dim (", c.dim, ") must be divisible by --heads (",
           c.heads, ")");
  BT_CHECK(c.lr > 0, "demo: --lr must be > 0");
  BT_CHECK(c.eval_every > 0, "demo: --eval-every must be > 0");
  return c;
}

}  // namespace

int run_demo(int argc, char** argv) {
  const Config cfg = parse(argc, argv);
  const Corpus corpus = load_corpus(cfg.data);
  const int vocab = static_cast<int>(corpus.itos.size());
  Model model = init_model(vocab, cfg);
  int64_t nparams = 0;
  for (auto& t : model.matrices()) nparams += t.numel();
  for (auto& t : model.vectors()) nparams += t.numel();
  std::printf("blutrain demo: %s, %zu train / %zu val characters, vocabulary %d\n", cfg.data.c_str(),
              corpus.train.size(), corpus.val.size(), vocab);
  std::printf("model: %d layers, width %d, %d heads, context %d, %.2fM parameters, device %s\n", cfg.layers,
              cfg.dim, cfg.heads, cfg.seq, nparams / 1e6, cfg.device.str().c_str());
  std::printf("uniform-guess loss is ln(%d) = %.3f\n", vocab, std::log(static_cast<double>(vocab)));
  std::fflush(stdout);

  AdamWOptions ao;
  ao.lr = cfg.lr;
  ao.beta2 = 0.99;
  AdamW opt({AdamW::Group{model.matrices(), 0.1}, AdamW::Group{model.vectors(), 0.0}}, ao);
  std::mt19937_64 rng(cfg.seed);
  const bool tty = isatty(fileno(stdout));
  const int warmup = std::max(1, cfg.steps / 20);
  const auto t0 = std::chrono::steady_clock::now();
  double ema = 0;
  for (int step = 1; step <= cfg.steps; ++step) {
    // Linear warmup, then cosine decay to 10% of the peak.
    const double lr =
        step <= warmup
            ? cfg.lr * step / warmup
            : cfg.lr * (0.1 + 0.45 * (1 + std::cos(M_PI * (step - warmup) / (cfg.steps - warmup + 1e-9))));
    opt.set_lr(lr);
    auto [x, y] = batch(corpus.train, cfg.batch, cfg.seq, rng, cfg.device);
    opt.zero_grad();
    Tensor logits = forward(model, x);
    Tensor loss = cross_entropy(logits.view({-1, vocab}), y.view({-1}));
    loss.backward();
    opt.step();
    const double l = loss.item<float>();
    ema = step == 1 ? l : 0.9 * ema + 0.1 * l;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = static_cast<double>(step) * cfg.batch * cfg.seq / secs;
    const double eta = secs / step * (cfg.steps - step);
    const bool eval = step % cfg.eval_every == 0 || step == cfg.steps;
    if (tty) {
      std::printf("\rstep %5d/%d  loss %.4f  lr %.2e  %.0f tok/s  eta %4.0fs   ", step, cfg.steps, ema, lr,
                  tps, eta);
      if (eval) std::printf("\n");
    } else if (step % 20 == 0 || step == 1 || eval) {
      std::printf("step %5d/%d  loss %.4f  lr %.2e  %.0f tok/s  eta %.0fs\n", step, cfg.steps, ema, lr, tps,
                  eta);
    }
    if (eval) std::printf("step %5d  val loss %.4f\n", step, evaluate(model, corpus, cfg, 8));
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("trained %d steps in %.1fs\n\n--- sample (temperature 0.8) ---\n%s\n--- end of sample ---\n",
              cfg.steps, secs, printable(sample(model, corpus, cfg, "The ")).c_str());
  return 0;
}

}  // namespace bt::launcher
