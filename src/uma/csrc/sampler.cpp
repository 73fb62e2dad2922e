#include "sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace uma {
namespace {

// Most probable first; equal logits by token id so the order (and so every draw) is fully
// determined by the logits alone.
inline bool before(const Candidate & a, const Candidate & b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

inline int32_t argmax(const float * row, int32_t n) {
    int32_t best = 0;
    float best_v = row[0];
    for (int32_t i = 1; i < n; ++i) {
        if (row[i] > best_v) {
            best_v = row[i];
            best = i;
        }
    }
    return best;
}

// log softmax of one entry, over the raw row: the model's own belief in the token.
float log_prob_of(const float * row, int32_t n, int32_t token) {
    float m = row[0];
    for (int32_t i = 1; i < n; ++i) m = std::max(m, row[i]);
    double z = 0.0;
    for (int32_t i = 0; i < n; ++i) z += std::exp(static_cast<double>(row[i] - m));
    return static_cast<float>(static_cast<double>(row[token] - m) - std::log(z));
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

Sampler::Sampler(int32_t n_slots, int32_t n_vocab)
    : n_vocab_(n_vocab), slots_(static_cast<size_t>(n_slots)),
      scratch_(static_cast<size_t>(n_vocab)) {
    cands_.reserve(static_cast<size_t>(n_vocab));
    for (int32_t i = 0; i < n_slots; ++i) configure(i, SamplingParams{});
}

Sampler::~Sampler() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_job_.notify_all();
    if (worker_.joinable()) worker_.join();
}

void Sampler::configure(int32_t slot, const SamplingParams & params) {
    Slot & s = slots_[static_cast<size_t>(slot)];
    s.params = params;
    s.rng.seed(params.seed);
    s.window.assign(static_cast<size_t>(std::max(params.penalty_last_n, 0)), 0);
    s.window_pos = 0;
    s.window_fill = 0;
    s.counts.clear();
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

const float * Sampler::penalised(Slot & slot, const float * row) {
    const SamplingParams & p = slot.params;
    bool any = !slot.counts.empty() &&
               (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
    if (!any) return row;
    std::memcpy(scratch_.data(), row, sizeof(float) * static_cast<size_t>(n_vocab_));
    for (const auto & [token, count] : slot.counts) {
        if (token < 0 || token >= n_vocab_) continue;
        float l = scratch_[static_cast<size_t>(token)];
        if (p.repeat_penalty != 1.0f) l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
        l -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
        scratch_[static_cast<size_t>(token)] = l;
    }
    return scratch_.data();
}

void Sampler::filter(Slot & slot, const float * row, bool need_sorted) {
    const SamplingParams & p = slot.params;
    const float inv_t = 1.0f / p.temperature;
    const size_t n = static_cast<size_t>(n_vocab_);

    cands_.resize(n);
    for (size_t i = 0; i < n; ++i) cands_[i] = Candidate{row[i] * inv_t, static_cast<int32_t>(i)};
    cands_sorted_ = false;

    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cands_.size()) {
        std::nth_element(cands_.begin(), cands_.begin() + p.top_k, cands_.end(), before);
        cands_.resize(static_cast<size_t>(p.top_k));
    }

    float m = cands_[0].logit;
    for (const auto & c : cands_) m = std::max(m, c.logit);
    cands_max_ = m;

    if (p.top_p < 1.0f) {
        double z = 0.0;
        for (const auto & c : cands_) z += std::exp(static_cast<double>(c.logit - m));
        // Grow the sorted prefix until it holds top_p of the mass: real models need only a few
        // dozen tokens; a flat distribution falls back to a full sort. Exact either way.
        const double target = static_cast<double>(p.top_p) * z;
        size_t sorted = 0;
        size_t want = 64;
        double cum = 0.0;
        size_t keep = cands_.size();
        while (true) {
            sort_front(cands_, want);
            size_t limit = std::min(want, cands_.size());
            for (size_t i = sorted; i < limit; ++i) {
                cum += std::exp(static_cast<double>(cands_[i].logit - m));
                if (cum >= target) {
                    keep = i + 1;
                    break;
                }
            }
            if (keep != cands_.size() || limit == cands_.size()) break;
            sorted = limit;
            want *= 8;
        }
        cands_.resize(std::max<size_t>(keep, 1));
        cands_sorted_ = true;
    }

    if (p.min_p > 0.0f) {
        // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p); max is unchanged by
        // the filters above since they only drop tokens below it.
        const float floor = m + std::log(p.min_p);
        cands_.erase(std::remove_if(cands_.begin(), cands_.end(),
                                    [floor](const Candidate & c) { return c.logit < floor; }),
                     cands_.end());
    }

    if (need_sorted && !cands_sorted_) {
        std::sort(cands_.begin(), cands_.end(), before);
        cands_sorted_ = true;
    }
}

int32_t Sampler::sample_row(Slot & slot, const float * raw, float * logprob) {
    const float * row = penalised(slot, raw);
    int32_t token;
    if (slot.params.temperature <= 0.0f) {
        token = argmax(row, n_vocab_);
    } else {
        filter(slot, row, /*need_sorted=*/false);
        const float m = cands_max_;
        double z = 0.0;
        for (const auto & c : cands_) z += std::exp(static_cast<double>(c.logit - m));
        const double u = uniform(slot) * z;
        double cum = 0.0;
        token = cands_.back().id;
        for (const auto & c : cands_) {
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

void Sampler::sample(const SampleJob & job) {
    for (int32_t i = 0; i < job.n; ++i) {
        const float * row = job.logits + static_cast<size_t>(job.rows[i]) * static_cast<size_t>(n_vocab_);
        Slot & slot = slots_[static_cast<size_t>(job.slots[i])];
        job.out_tokens[i] = sample_row(slot, row, job.out_logprobs ? job.out_logprobs + i : nullptr);
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
    const float * row = penalised(s, raw);
    if (s.params.temperature <= 0.0f) {
        out_ids[0] = argmax(row, n_vocab_);
        out_probs[0] = 1.0f;
        return 1;
    }
    filter(s, row, /*need_sorted=*/true);
    const float m = cands_max_;
    double z = 0.0;
    for (const auto & c : cands_) z += std::exp(static_cast<double>(c.logit - m));
    for (size_t i = 0; i < cands_.size(); ++i) {
        out_ids[i] = cands_[i].id;
        out_probs[i] = static_cast<float>(std::exp(static_cast<double>(cands_[i].logit - m)) / z);
    }
    return static_cast<int32_t>(cands_.size());
}

}  // namespace uma
