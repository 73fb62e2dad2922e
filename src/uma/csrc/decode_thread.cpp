#include "decode_thread.hpp"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "logsink.hpp"

namespace uma {

namespace {

// llama_decode with the lines llama.cpp logged meanwhile on this thread copied to problem.
int32_t decode_here(llama_context * ctx, llama_batch batch, char * problem, std::size_t cap) {
    log_clear_problem();  // the log lines are kept per thread: this one's
    int32_t rc = llama_decode(ctx, batch);
    if (problem != nullptr && cap > 0) log_last_problem(problem, cap);
    return rc;
}

struct Job {
    llama_context * ctx;
    llama_batch batch;
    char * problem;
    std::size_t cap;
    int32_t result;
};

class DecodeThread {
public:
    DecodeThread() : owner_(getpid()) {
        std::thread worker([this] { run(); });
        worker.detach();  // lives as long as the process: never joined at exit
    }

    int32_t decode(llama_context * ctx, llama_batch batch, char * problem, std::size_t cap) {
        Job job{ctx, batch, problem, cap, 0};
        std::lock_guard<std::mutex> turn(turn_);  // one caller's job at a time
        std::unique_lock<std::mutex> lock(mutex_);
        job_ = &job;
        done_ = false;
        wake_.notify_one();
        finished_.wait(lock, [this] { return done_; });
        return job.result;
    }

    pid_t owner() const { return owner_; }

    std::atomic<uint64_t> calls{0};
    std::atomic<int64_t> tid{0};

private:
    void run() {
        pthread_setname_np(pthread_self(), "uma-decode");
        tid.store(static_cast<int64_t>(syscall(SYS_gettid)));
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            wake_.wait(lock, [this] { return job_ != nullptr; });
            Job * job = job_;
            job_ = nullptr;
            lock.unlock();
            job->result = decode_here(job->ctx, job->batch, job->problem, job->cap);
            calls.fetch_add(1, std::memory_order_relaxed);
            lock.lock();
            done_ = true;
            finished_.notify_one();
        }
    }

    const pid_t owner_;
    std::mutex turn_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable finished_;
    Job * job_ = nullptr;
    bool done_ = false;
};

std::mutex g_start;
std::atomic<DecodeThread *> g_thread{nullptr};

DecodeThread & decode_thread() {
    DecodeThread * thread = g_thread.load(std::memory_order_acquire);
    // A forked child has no such thread (only the forking thread survives a fork): it gets its
    // own. The parent's object is left alone, as its locks may have been held at the fork.
    if (thread != nullptr && thread->owner() == getpid()) return *thread;
    std::lock_guard<std::mutex> lock(g_start);
    thread = g_thread.load(std::memory_order_acquire);
    if (thread == nullptr || thread->owner() != getpid()) {
        thread = new DecodeThread();  // never freed: decodes may come until the process ends
        g_thread.store(thread, std::memory_order_release);
    }
    return *thread;
}

}  // namespace

int32_t decode(llama_context * ctx, llama_batch batch, bool on_decode_thread, char * problem,
               std::size_t cap) {
    if (!on_decode_thread) return decode_here(ctx, batch, problem, cap);
    return decode_thread().decode(ctx, batch, problem, cap);
}

uint64_t decode_thread_calls() {
    DecodeThread * thread = g_thread.load(std::memory_order_acquire);
    return thread == nullptr ? 0 : thread->calls.load(std::memory_order_relaxed);
}

int64_t decode_thread_id() {
    DecodeThread * thread = g_thread.load(std::memory_order_acquire);
    return thread == nullptr ? 0 : thread->tid.load();
}

}  // namespace uma
