#include "sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace uma {
namespace {

// Most probable first; equal logits by token id so the order (and so every draw) is fully
// determined by the logits alone.
inline bool before(const Candidate & a, const Candidate & b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// The maximum of a block in eight independent lanes, which compilers vectorise (a running
// arg-max they do not). NaNs never win.
inline float block_max(const float * x, int32_t n) {
    constexpr int32_t kLanes = 8;
    float lanes[kLanes];
    for (float & l : lanes) l = -std::numeric_limits<float>::infinity();
    int32_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int32_t k = 0; k < kLanes; ++k) lanes[k] = x[i + k] > lanes[k] ? x[i + k] : lanes[k];
    }
    float m = lanes[0];
    for (int32_t k = 1; k < kLanes; ++k) m = lanes[k] > m ? lanes[k] : m;
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
}

// The first index of the row's maximum in one pass over it: block maxima (vectorised), the
// first block holding the largest, then a scan of that block alone. Scanning the whole row
// again for the index made greedy sampling 5x slower than numpy's arg-max (32 rows of a
// 128k vocabulary: 1.4 ms against 0.28 on one core). An all-NaN row gives 0.
inline int32_t argmax(const float * row, int32_t n) {
    constexpr int32_t kBlock = 1024;  // 4 KB: the rescan stays in L1
    float best = -std::numeric_limits<float>::infinity();
    int32_t best_block = -1;
    for (int32_t b = 0; b < n; b += kBlock) {
        const float m = block_max(row + b, std::min(kBlock, n - b));
        if (m > best) {
            best = m;
            best_block = b;
        }
    }
    if (best_block < 0) return 0;
    const int32_t end = std::min(best_block + kBlock, n);
    for (int32_t i = best_block; i < end; ++i) {
        if (row[i] == best) return i;
    }
    return best_block;
}

// e^x for x <= 0 in plain float arithmetic, which compilers vectorise (std::exp they call
// once per element: 128k of them made a tempered draw cost 4 ms a row). Cephes' expf:
// x = n ln 2 + r with |r| <= ln 2 / 2, e^r by a degree-6 polynomial, 2^n built in the exponent
// bits; relative error below 2e-7. Below -87 (and -infinity): exactly 0.
inline float exp_nonpositive(float x) {
    const bool tiny = !(x >= -87.0f);  // NaN counts as tiny too
    const float xc = tiny ? -87.0f : x;
    // round to nearest by the 1.5 * 2^23 trick (no call, no SSE4.1 rounding instruction)
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * r * r + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return tiny ? 0.0f : er * scale;
}

// Sum of e^(x_i * scale - m) over a block, each term written to out, zero where
// x_i * scale - m < floor. Branch-free in eight lanes, so that it vectorises.
inline float exp_sum(const float * x, int32_t n, float scale, float m, float floor, float * out) {
    for (int32_t i = 0; i < n; ++i) {
        const float d = x[i] * scale - m;
        const float w = exp_nonpositive(d);
        out[i] = d >= floor ? w : 0.0f;
    }
    constexpr int32_t kLanes = 8;
    float lanes[kLanes] = {};
    int32_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int32_t k = 0; k < kLanes; ++k) lanes[k] += out[i + k];
    }
    float s = 0.0f;
    for (; i < n; ++i) s += out[i];
    for (float l : lanes) s += l;
    return s;
}

// log sum exp of a raw row, with its maximum m: log softmax(x_i) = x_i - m - lse_shifted.
double log_norm(const float * row, int32_t n, float & m) {
    m = block_max(row, n);
    double z = 0.0;
    constexpr float kAll = -std::numeric_limits<float>::infinity();
    float terms[kDrawBlock];
    for (int32_t b = 0; b < n; b += kDrawBlock) {
        z += exp_sum(row + b, std::min(kDrawBlock, n - b), 1.0f, m, kAll, terms);
    }
    return std::log(z);
}

// log softmax of one entry, over the raw row: the model's own belief in the token.
float log_prob_of(const float * row, int32_t n, int32_t token) {
    float m;
    const double lz = log_norm(row, n, m);
    return static_cast<float>(static_cast<double>(row[token] - m) - lz);
}

// The k best of a row scaled by `scale` into `heap`: a heap with the worst of them on top, so
// most tokens lose to the top in one comparison, far cheaper than materialising every one.
void best_k(const float * row, int32_t n, float scale, size_t k, std::vector<Candidate> & heap) {
    heap.clear();
    for (int32_t i = 0; i < n; ++i) {
        const Candidate c{row[i] * scale, i};
        if (heap.size() < k) {
            heap.push_back(c);
            std::push_heap(heap.begin(), heap.end(), before);
        } else if (before(c, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), before);
            heap.back() = c;
            std::push_heap(heap.begin(), heap.end(), before);
        }
    }
}

// Sorts the best `k` candidates to the front.
void sort_front(std::vector<Candidate> & c, size_t k) {
    k = std::min(k, c.size());
    std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k), c.end(), before);
}

}  // namespace

void Sampler::Slot::remember(int32_t token) {
    if (params.penalty_last_n <= 0) return;
    if (window_fill == window.size()) {
        int32_t old = window[window_pos];
        auto it = counts.find(old);
        if (it != counts.end() && --it->second == 0) counts.erase(it);
    } else {
        ++window_fill;
    }
    window[window_pos] = token;
    window_pos = (window_pos + 1) % window.size();
    ++counts[token];
}

Sampler::Sampler(int32_t n_slots, int32_t n_vocab, int32_t n_threads)
    : n_vocab_(n_vocab), slots_(static_cast<size_t>(n_slots)) {
    if (n_threads <= 0) {
        n_threads = static_cast<int32_t>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
    }
    ws_.resize(static_cast<size_t>(n_threads));
    for (auto & ws : ws_) {
        ws.scratch.resize(static_cast<size_t>(n_vocab));
        ws.weights.resize(static_cast<size_t>(n_vocab));
        ws.block_sums.resize(static_cast<size_t>((n_vocab + kDrawBlock - 1) / kDrawBlock));
    }
    for (int32_t i = 0; i < n_slots; ++i) configure(i, SamplingParams{});
}

Sampler::~Sampler() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_job_.notify_all();
    if (worker_.joinable()) worker_.join();
    {
        std::lock_guard<std::mutex> lock(pool_mu_);
        pool_stop_ = true;
    }
    pool_cv_.notify_all();
    for (auto & t : pool_) t.join();
}

void Sampler::configure(int32_t slot, const SamplingParams & params) {
    Slot & s = slots_[static_cast<size_t>(slot)];
    s.params = params;
    s.rng.seed(params.seed);
    s.window.assign(static_cast<size_t>(std::max(params.penalty_last_n, 0)), 0);
    s.window_pos = 0;
    s.window_fill = 0;
    s.counts.clear();
    s.bias.clear();
}

void Sampler::set_bias(int32_t slot, const int32_t * tokens, const float * values, int32_t n) {
    Slot & s = slots_[static_cast<size_t>(slot)];
    s.bias.clear();
    for (int32_t i = 0; i < n; ++i) {
        if (tokens[i] >= 0 && tokens[i] < n_vocab_) s.bias.emplace_back(tokens[i], values[i]);
    }
}

void Sampler::accept(int32_t slot, const int32_t * tokens, int32_t n) {
    Slot & s = slots_[static_cast<size_t>(slot)];
    for (int32_t i = 0; i < n; ++i) s.remember(tokens[i]);
}

double Sampler::uniform(Slot & slot) {
    // 53 random bits -> [0, 1). std::uniform_real_distribution is implementation-defined, and
    // a seed must give the same tokens with every standard library.
    return static_cast<double>(slot.rng() >> 11) * (1.0 / 9007199254740992.0);
}

const float * Sampler::penalised(Workspace & ws, Slot & slot, const float * row) {
    const SamplingParams & p = slot.params;
    bool any = !slot.counts.empty() &&
               (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
    if (!any && slot.bias.empty()) return row;
    float * out = ws.scratch.data();
    std::memcpy(out, row, sizeof(float) * static_cast<size_t>(n_vocab_));
    for (const auto & [token, value] : slot.bias) out[token] += value;
    if (!any) return out;
    for (const auto & [token, count] : slot.counts) {
        if (token < 0 || token >= n_vocab_) continue;
        float l = out[token];
        if (p.repeat_penalty != 1.0f) l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
        l -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
        out[token] = l;
    }
    return out;
}

void Sampler::filter(Workspace & ws, Slot & slot, const float * row, bool need_sorted) {
    const SamplingParams & p = slot.params;
    const float inv_t = 1.0f / p.temperature;
    const size_t n = static_cast<size_t>(n_vocab_);
    std::vector<Candidate> & cands = ws.cands;

    ws.sorted = false;
    const size_t k = p.top_k > 0 ? static_cast<size_t>(p.top_k) : n;
    if (k * 16 <= n) {
        best_k(row, n_vocab_, inv_t, k, cands);  // a small top-k: one pass
    } else {
        cands.resize(n);
        for (size_t i = 0; i < n; ++i) cands[i] = Candidate{row[i] * inv_t, static_cast<int32_t>(i)};
        if (k < n) {
            std::nth_element(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(k),
                             cands.end(), before);
            cands.resize(k);
        }
    }

    float m = cands[0].logit;
    for (const auto & c : cands) m = std::max(m, c.logit);
    ws.cands_max = m;

    if (p.top_p < 1.0f) {
        double z = 0.0;
        for (const auto & c : cands) z += std::exp(static_cast<double>(c.logit - m));
        // Grow the sorted prefix until it holds top_p of the mass: real models need only a few
        // dozen tokens; a flat distribution falls back to a full sort. Exact either way.
        const double target = static_cast<double>(p.top_p) * z;
        size_t sorted = 0;
        size_t want = 64;
        double cum = 0.0;
        size_t keep = cands.size();
        while (true) {
            sort_front(cands, want);
            size_t limit = std::min(want, cands.size());
            for (size_t i = sorted; i < limit; ++i) {
                cum += std::exp(static_cast<double>(cands[i].logit - m));
                if (cum >= target) {
                    keep = i + 1;
                    break;
                }
            }
            if (keep != cands.size() || limit == cands.size()) break;
            sorted = limit;
            want *= 8;
        }
        cands.resize(std::max<size_t>(keep, 1));
        ws.sorted = true;
    }

    if (p.min_p > 0.0f) {
        // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p); max is unchanged by
        // the filters above since they only drop tokens below it.
        const float floor = m + std::log(p.min_p);
        cands.erase(std::remove_if(cands.begin(), cands.end(),
                                    [floor](const Candidate & c) { return c.logit < floor; }),
                     cands.end());
    }

    if (need_sorted && !ws.sorted) {
        std::sort(cands.begin(), cands.end(), before);
        ws.sorted = true;
    }
}

const float * Sampler::masked(Workspace & ws, const float * row, const uint32_t * mask) {
    if (!mask) return row;
    float * out = ws.scratch.data();
    if (row != out) std::memcpy(out, row, sizeof(float) * static_cast<size_t>(n_vocab_));
    const int32_t words = (n_vocab_ + 31) / 32;
    for (int32_t w = 0; w < words; ++w) {
        const uint32_t m = mask[w];
        if (m == 0xFFFFFFFFu) continue;
        const int32_t base = w * 32;
        const int32_t end = std::min(base + 32, n_vocab_);
        for (int32_t t = base; t < end; ++t) {
            if (!((m >> (t - base)) & 1u)) out[t] = -std::numeric_limits<float>::infinity();
        }
    }
    return out;
}

int32_t Sampler::sample_row(Workspace & ws, Slot & slot, const float * raw, float * logprob,
                            const uint32_t * mask) {
    const float * row = masked(ws, penalised(ws, slot, raw), mask);
    const SamplingParams & p = slot.params;
    int32_t token;
    if (p.temperature <= 0.0f) {
        token = argmax(row, n_vocab_);
    } else if (p.top_p >= 1.0f && (p.top_k <= 0 || p.top_k >= n_vocab_)) {
        token = draw_tempered(ws, slot, row);
    } else {
        filter(ws, slot, row, /*need_sorted=*/false);
        const float m = ws.cands_max;
        double z = 0.0;
        for (const auto & c : ws.cands) z += std::exp(static_cast<double>(c.logit - m));
        const double u = uniform(slot) * z;
        double cum = 0.0;
        token = ws.cands.back().id;
        for (const auto & c : ws.cands) {
            cum += std::exp(static_cast<double>(c.logit - m));
            if (u < cum) {
                token = c.id;
                break;
            }
        }
    }
    if (logprob) *logprob = log_prob_of(raw, n_vocab_, token);
    slot.remember(token);
    return token;
}

int32_t Sampler::draw_tempered(Workspace & ws, Slot & slot, const float * row) {
    const SamplingParams & p = slot.params;
    const float inv_t = 1.0f / p.temperature;
    // the largest scaled logit is the largest logit scaled: temperatures are positive
    const float m = block_max(row, n_vocab_) * inv_t;
    if (!(m > -std::numeric_limits<float>::infinity())) return argmax(row, n_vocab_);
    // min-p: p_i >= min_p * p_max  <=>  scaled_i - m >= log(min_p)
    const float floor = p.min_p > 0.0f ? std::log(p.min_p) : -std::numeric_limits<float>::infinity();
    float * w = ws.weights.data();
    double z = 0.0;
    const int32_t n_blocks = (n_vocab_ + kDrawBlock - 1) / kDrawBlock;
    for (int32_t b = 0; b < n_blocks; ++b) {
        const int32_t at = b * kDrawBlock;
        ws.block_sums[static_cast<size_t>(b)] =
            exp_sum(row + at, std::min(kDrawBlock, n_vocab_ - at), inv_t, m, floor, w + at);
        z += ws.block_sums[static_cast<size_t>(b)];
    }
    // the first token, in id order, where the running sum passes u * z: as the candidate
    // list's draw, block sums first to skip whole blocks
    const double u = uniform(slot) * z;
    double cum = 0.0;
    int32_t b = 0;
    while (b + 1 < n_blocks && cum + ws.block_sums[static_cast<size_t>(b)] <= u) {
        cum += ws.block_sums[static_cast<size_t>(b)];
        ++b;
    }
    int32_t last = -1;
    const int32_t end = std::min((b + 1) * kDrawBlock, n_vocab_);
    for (int32_t i = b * kDrawBlock; i < end; ++i) {
        if (w[i] <= 0.0f) continue;
        last = i;
        cum += w[i];
        if (u < cum) return i;
    }
    if (last >= 0) return last;  // rounding left u at the very end of the block
    for (int32_t i = n_vocab_ - 1; i >= 0; --i) {  // ... or of an all-zero block
        if (w[i] > 0.0f) return i;
    }
    return argmax(row, n_vocab_);
}

void Sampler::top_logprobs(const float * logits, const int32_t * rows, int32_t n, int32_t k,
                           int32_t * out_ids, float * out_logprobs) const {
    k = std::min(k, n_vocab_);
    std::vector<Candidate> best;
    best.reserve(static_cast<size_t>(k) + 1);
    for (int32_t r = 0; r < n; ++r) {
        const float * row = logits + static_cast<size_t>(rows[r]) * static_cast<size_t>(n_vocab_);
        best_k(row, n_vocab_, 1.0f, static_cast<size_t>(k), best);
        std::sort_heap(best.begin(), best.end(), before);
        float m;
        const double lz = log_norm(row, n_vocab_, m);
        for (int32_t j = 0; j < k; ++j) {
            const size_t at = static_cast<size_t>(r) * static_cast<size_t>(k) + static_cast<size_t>(j);
            out_ids[at] = best[static_cast<size_t>(j)].id;
            out_logprobs[at] = static_cast<float>(
                static_cast<double>(best[static_cast<size_t>(j)].logit - m) - lz);
        }
    }
}

void Sampler::sample_rows(Workspace & ws, const SampleJob & job, int32_t i) {
    const float * row = job.logits + static_cast<size_t>(job.rows[i]) * static_cast<size_t>(n_vocab_);
    Slot & slot = slots_[static_cast<size_t>(job.slots[i])];
    const uint32_t * mask = job.mask_index && job.mask_index[i] >= 0
        ? job.masks + static_cast<size_t>(job.mask_index[i]) * static_cast<size_t>(job.mask_words)
        : nullptr;
    job.out_tokens[i] = sample_row(ws, slot, row, job.out_logprobs ? job.out_logprobs + i : nullptr,
                                   mask);
}

bool Sampler::slots_repeat(const SampleJob & job) {
    if (slot_job_.size() != slots_.size()) slot_job_.assign(slots_.size(), 0);
    ++job_stamp_;
    for (int32_t i = 0; i < job.n; ++i) {
        uint64_t & stamp = slot_job_[static_cast<size_t>(job.slots[i])];
        if (stamp == job_stamp_) return true;
        stamp = job_stamp_;
    }
    return false;
}

void Sampler::sample(const SampleJob & job) {
    // Below a few hundred thousand logits, waking threads costs more than it saves. Rows that
    // share a slot draw from its one RNG and grow its one penalty history, in row order: shared
    // between threads they raced (a segfault, one run in a few hundred, when 4,000 rows of one
    // slot were sampled together), so such a job runs on this thread alone. The engine's ticks
    // have one row a slot.
    const bool parallel = ws_.size() > 1 && job.n > 1 &&
                          static_cast<int64_t>(job.n) * n_vocab_ >= (1 << 18) &&
                          !slots_repeat(job);
    if (!parallel) {
        for (int32_t i = 0; i < job.n; ++i) sample_rows(ws_[0], job, i);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(pool_mu_);
        while (pool_.size() + 1 < ws_.size()) {
            pool_.emplace_back(&Sampler::pool_loop, this, static_cast<int32_t>(pool_.size() + 1));
        }
        pool_job_ = &job;
        next_row_.store(0);
        pool_busy_ = static_cast<int32_t>(pool_.size());
        ++pool_gen_;
    }
    pool_cv_.notify_all();
    for (int32_t i; (i = next_row_.fetch_add(1)) < job.n;) sample_rows(ws_[0], job, i);
    std::unique_lock<std::mutex> lock(pool_mu_);
    pool_done_cv_.wait(lock, [this] { return pool_busy_ == 0; });
    pool_job_ = nullptr;
}

void Sampler::pool_loop(int32_t index) {
    Workspace & ws = ws_[static_cast<size_t>(index)];
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(pool_mu_);
    while (true) {
        pool_cv_.wait(lock, [&] { return pool_stop_ || pool_gen_ != seen; });
        if (pool_stop_) return;
        seen = pool_gen_;
        const SampleJob & job = *pool_job_;
        lock.unlock();
        for (int32_t i; (i = next_row_.fetch_add(1)) < job.n;) sample_rows(ws, job, i);
        lock.lock();
        if (--pool_busy_ == 0) pool_done_cv_.notify_all();
    }
}

void Sampler::submit(const SampleJob & job) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        pending_ = job;
        has_job_ = true;
        if (!worker_.joinable()) worker_ = std::thread(&Sampler::worker_loop, this);
    }
    cv_job_.notify_one();
}

void Sampler::wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [this] { return !has_job_; });
}

bool Sampler::busy() {
    std::lock_guard<std::mutex> lock(mu_);
    return has_job_;
}

void Sampler::worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
        cv_job_.wait(lock, [this] { return has_job_ || stop_; });
        if (stop_) return;
        SampleJob job = pending_;
        lock.unlock();
        sample(job);
        lock.lock();
        has_job_ = false;
        cv_done_.notify_all();
    }
}

int32_t Sampler::candidates(int32_t slot, const float * raw, int32_t * out_ids, float * out_probs) {
    Slot & s = slots_[static_cast<size_t>(slot)];
    Workspace & ws = ws_[0];
    const float * row = penalised(ws, s, raw);
    if (s.params.temperature <= 0.0f) {
        out_ids[0] = argmax(row, n_vocab_);
        out_probs[0] = 1.0f;
        return 1;
    }
    filter(ws, s, row, /*need_sorted=*/true);
    const float m = ws.cands_max;
    double z = 0.0;
    for (const auto & c : ws.cands) z += std::exp(static_cast<double>(c.logit - m));
    for (size_t i = 0; i < ws.cands.size(); ++i) {
        out_ids[i] = ws.cands[i].id;
        out_probs[i] = static_cast<float>(std::exp(static_cast<double>(ws.cands[i].logit - m)) / z);
    }
    return static_cast<int32_t>(ws.cands.size());
}

}  // namespace uma
