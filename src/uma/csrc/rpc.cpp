#include "rpc.hpp"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"

namespace uma {
namespace {

ggml_backend_reg_t rpc_reg() { return ggml_backend_reg_by_name("RPC"); }

std::mutex g_mu;
std::condition_variable g_cv;
std::string g_abort_message;
bool g_aborted = false;
uint64_t g_cancels = 0;  // abort_wait_cancel calls: each ends the waits under way

void hold_on_abort(const char * message) {
    std::unique_lock<std::mutex> lock(g_mu);
    if (!g_aborted) {
        g_aborted = true;
        g_abort_message = message ? message : "";
    }
    g_cv.notify_all();
    // Never returns: ggml_abort calls abort() once this does. The thread stays parked with
    // whatever it held; the rest of the process carries on without it.
    g_cv.wait(lock, [] { return false; });
}

}  // namespace

bool rpc_compiled() { return rpc_reg() != nullptr; }

int32_t rpc_add_worker(const char * endpoint, char * names, std::size_t cap, int32_t max_names) {
    static std::mutex mu;
    static std::set<std::string> added;
    std::lock_guard<std::mutex> lock(mu);
    ggml_backend_reg_t reg = rpc_reg();
    if (!reg || added.count(endpoint)) return 0;
    using add_fn = ggml_backend_reg_t (*)(const char *);
    auto add = reinterpret_cast<add_fn>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server"));
    if (!add) return 0;
    ggml_backend_reg_t server = add(endpoint);
    if (!server) return 0;
    ggml_backend_register(server);
    added.insert(endpoint);
    const int32_t n = static_cast<int32_t>(ggml_backend_reg_dev_count(server));
    for (int32_t i = 0; i < n && i < max_names; ++i) {
        std::strncpy(names + static_cast<std::size_t>(i) * cap,
                     ggml_backend_dev_name(ggml_backend_reg_dev_get(server, static_cast<std::size_t>(i))),
                     cap - 1);
        names[static_cast<std::size_t>(i) * cap + cap - 1] = '\0';
    }
    return n;
}

bool rpc_serve(const char * endpoint, const char * cache_dir, std::size_t n_threads) {
    ggml_backend_reg_t reg = rpc_reg();
    if (!reg) return false;
    using serve_fn = void (*)(const char *, const char *, std::size_t, std::size_t, ggml_backend_dev_t *);
    auto serve = reinterpret_cast<serve_fn>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_start_server"));
    if (!serve) return false;
    // as llama.cpp's rpc-server chooses: every accelerator, else the CPU
    std::vector<ggml_backend_dev_t> devices;
    for (std::size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(dev);
        if (type != GGML_BACKEND_DEVICE_TYPE_CPU && type != GGML_BACKEND_DEVICE_TYPE_ACCEL &&
            ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)) != std::string("RPC")) {
            devices.push_back(dev);
        }
    }
    if (devices.empty()) devices.push_back(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
    serve(endpoint, cache_dir, n_threads, devices.size(), devices.data());
    return true;
}

void abort_hold_install() { ggml_set_abort_callback(hold_on_abort); }

bool abort_wait(char * buf, std::size_t cap) {
    std::unique_lock<std::mutex> lock(g_mu);
    const uint64_t cancels = g_cancels;
    g_cv.wait(lock, [cancels] { return g_aborted || g_cancels != cancels; });
    if (!g_aborted) return false;
    std::strncpy(buf, g_abort_message.c_str(), cap - 1);
    buf[cap - 1] = '\0';
    return true;
}

void abort_wait_cancel() {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_cancels;
    g_cv.notify_all();
}

}  // namespace uma
