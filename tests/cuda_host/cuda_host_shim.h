// tests/cuda_host/cuda_host_shim.h -- run the CUDA kernels of kernels/*.cu on the CPU.
//
// Test-only. tests/cuda_host/harness.py compiles one translation unit
//     #include "cuda_host_shim.h"
//     <kernels/<file>.cu, common.cuh inlined by gpuir.backends.kernels.load_source>
//     <generated table of the requested template instantiations>
// with `g++ -std=c++20 -O1 -pthread -shared` into a library loaded by ctypes.
// The kernel bodies are the real, unmodified ones; this header supplies the
// CUDA execution model for them:
//
//   * one std::thread per CUDA thread of a block; blocks run one after another
//     (forward, reverse or shuffled order); `__shared__` is a function-local
//     `static`, so it is per block, and it is filled with garbage ("poisoned")
//     before every block, as a GPU never zeroes shared memory;
//   * __syncthreads: a block barrier. Threads that return early drop out of it
//     (as on sm_70+). All threads of one barrier phase must call it from the
//     same source position: a __syncthreads in divergent code is an error;
//   * warp intrinsics (full mask only, all 32 lanes of a converged warp): a
//     per-warp exchange of the lanes' values plus a barrier. A lane that has
//     exited, a warp with fewer than 32 threads, lanes at different intrinsics,
//     or a lane of the warp waiting at __syncthreads is an error;
//   * atomics: std::atomic_ref; bit and float intrinsics: their exact host
//     equivalents (x86-64 SSE rounds every float operation to float32, and the
//     harness compiles with -ffp-contract=off, so there is no FMA contraction);
//   * __CUDA_ARCH__ is defined (800 unless the harness says otherwise) so the
//     device branches of common.cuh run, and GPUIR_HOST_EMU is defined.
//
// Scheduling. "parallel": every thread of the block runs at once, one
// std::thread each (real concurrency: races on atomics are real).
// "forward" / "reverse" / "random": one CUDA thread runs at a time, switching
// only at barriers and warp intrinsics, choosing the next thread by lowest id /
// highest id / at random; these run the CUDA threads as fibers (ucontext) on
// the launching thread, with the same barrier and warp state machine.
// The serial orders are deterministic, so a missing __syncthreads (a read of
// data another thread writes in the same barrier phase) shows as a wrong result
// under at least one of them, reproducibly.
//
// Misuse is reported, never a hang: every barrier knows which threads wait
// where; when no thread can make progress the launch fails with a message
// naming the waiting threads and source positions, and the kernel threads are
// unwound (KernelAbort). A watchdog fails a launch that makes no progress for
// `timeout_s` (an infinite loop; a spin-wait on another thread); if its
// threads still do not stop, the process aborts with a message.
//
// Supported subset: see docs/gpu.md, "Running the kernels on the CPU".
#pragma once

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <math.h>
#include <memory>
#include <mutex>
#include <random>
#include <source_location>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

// Serial schedules run their CUDA threads as fibers (ucontext) on the launching
// thread: a switch costs well under a microsecond where a hand-over between OS
// threads costs 5-20. AddressSanitizer builds use OS threads for every
// schedule (it does not follow swapcontext).
#ifndef GPUIR_HOST_FIBERS
#ifdef __SANITIZE_ADDRESS__
#define GPUIR_HOST_FIBERS 0
#else
#define GPUIR_HOST_FIBERS 1
#endif
#endif

// ---------------------------------------------------------------------------
// Built-in types and variables
// ---------------------------------------------------------------------------
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

#define GPUIR_HOST_VEC2(T, N) \
    struct alignas(2 * sizeof(T)) N##2 { T x, y; }; \
    inline N##2 make_##N##2(T x, T y) { return {x, y}; }
#define GPUIR_HOST_VEC4(T, N) \
    struct alignas(4 * sizeof(T) > 16 ? 16 : 4 * sizeof(T)) N##4 { T x, y, z, w; }; \
    inline N##4 make_##N##4(T x, T y, T z, T w) { return {x, y, z, w}; }
GPUIR_HOST_VEC2(int, int)
GPUIR_HOST_VEC2(unsigned int, uint)
GPUIR_HOST_VEC2(float, float)
GPUIR_HOST_VEC2(double, double)
GPUIR_HOST_VEC2(long long, longlong)
GPUIR_HOST_VEC2(unsigned long long, ulonglong)
GPUIR_HOST_VEC4(int, int)
GPUIR_HOST_VEC4(unsigned int, uint)
GPUIR_HOST_VEC4(float, float)
#undef GPUIR_HOST_VEC2
#undef GPUIR_HOST_VEC4

constexpr int warpSize = 32;

namespace gpuir_host {

//! Thrown inside kernel threads to unwind them after the launch failed.
struct KernelAbort {};

struct Launch;

//! What a kernel thread knows about itself.
struct ThreadCtx {
    Launch* L = nullptr;
    int tid = 0;   // linear thread id in the block: x + y*Dx + z*Dx*Dy
    int warp = 0;  // tid / 32
    int lane = 0;  // tid % 32
};

inline thread_local ThreadCtx t_ctx;
inline thread_local ::uint3 t_threadIdx{0, 0, 0};
inline thread_local ::uint3 t_blockIdx{0, 0, 0};
inline thread_local ::dim3 t_blockDim;
inline thread_local ::dim3 t_gridDim;

}  // namespace gpuir_host

#define threadIdx (static_cast<const ::uint3&>(::gpuir_host::t_threadIdx))
#define blockIdx (static_cast<const ::uint3&>(::gpuir_host::t_blockIdx))
#define blockDim (static_cast<const ::dim3&>(::gpuir_host::t_blockDim))
#define gridDim (static_cast<const ::dim3&>(::gpuir_host::t_gridDim))

// ---------------------------------------------------------------------------
// Keywords
// ---------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// One instance per block: a function-local static. The harness links with a
// script that gathers these (sections .bss._ZZ*, with -fdata-sections) between
// __gpuir_shared_start and __gpuir_shared_end, so they can be poisoned before
// every block. Do not give the shim itself function-local statics.
#define __shared__ static
// Dynamic shared memory (the launch's `shared` bytes). common.cuh defines this
// macro as `extern __shared__ T name[]` for NVRTC only if it is not yet defined.
#define GPUIR_EXTERN_SHARED(T, name) T* const name = static_cast<T*>(::gpuir_host::dynamic_shared())

#define GPUIR_HOST_EMU 1
#ifndef GPUIR_HOST_CUDA_ARCH
#define GPUIR_HOST_CUDA_ARCH 800
#endif
#if GPUIR_HOST_CUDA_ARCH > 0
#define __CUDA_ARCH__ GPUIR_HOST_CUDA_ARCH
#endif

extern "C" char __gpuir_shared_start[] __attribute__((weak, visibility("hidden")));
extern "C" char __gpuir_shared_end[] __attribute__((weak, visibility("hidden")));

namespace gpuir_host {

// ---------------------------------------------------------------------------
// The state of one launch (one block at a time)
// ---------------------------------------------------------------------------
enum Schedule { PARALLEL = 0, FORWARD = 1, REVERSE = 2, RANDOM = 3 };
enum ThreadState { RUN, READY, WAIT_SYNC, WAIT_WARP, EXITED };

//! A source position of a barrier or warp intrinsic.
struct Site {
    const char* what = "";
    const char* file = "";
    unsigned line = 0, column = 0;
    Site() = default;
    Site(const char* w, const std::source_location& l)
        : what(w), file(l.file_name()), line(l.line()), column(l.column()) {}
    bool operator==(const Site& o) const {
        return line == o.line && column == o.column && std::strcmp(what, o.what) == 0 &&
               std::strcmp(file, o.file) == 0;
    }
    std::string str() const {
        return std::string(what) + " at " + file + ":" + std::to_string(line) + ":" + std::to_string(column);
    }
};

struct ThreadRec {
    std::condition_variable cv;
    ThreadState state = EXITED;
    Site site;  // where it waits
};

struct WarpRec {
    int lanes = 0;    // threads in this warp (32 unless blockDim is not a multiple of 32)
    int live = 0;     // lanes not exited
    int arrived = 0;  // lanes waiting at the current warp intrinsic
    Site site;
    int width = 32;
    int parity = 0;   // the exchange buffer of the current intrinsic
    unsigned long long slot[2][32] = {};
};

struct Launch {
    // configuration
    const char* kernel = "";
    void (*invoke)(void**) = nullptr;
    void** args = nullptr;
    ::dim3 grid, block;
    int nthreads = 0, nwarps = 0;
    Schedule schedule = FORWARD;
    std::mt19937_64 rng;
    int poison = -1;  // -1: none; 0..255: that byte; 256: random bytes
    double timeout_s = 60.0;
    unsigned char* dyn = nullptr;  // dynamic shared memory + guard
    size_t dyn_bytes = 0;
    static constexpr size_t kGuard = 256;
    static constexpr size_t kFiberStack = 256 * 1024;  // plus one guard page below each
    static constexpr unsigned char kGuardByte = 0xDB;

    // state, guarded by m
    std::mutex m;
    std::condition_variable launcher_cv;
    std::unique_ptr<ThreadRec[]> thr;
    std::vector<WarpRec> warps;
    ::uint3 cur_block{0, 0, 0};
    unsigned long long block_gen = 0;
    bool stop = false;
    int live = 0;    // threads of the block not exited
    int active = 0;  // threads in state RUN
    int running = -1;
    int sync_arrived = 0;
    Site sync_site;
    int sync_kind = 0;    // 0 __syncthreads, 1 _count, 2 _and, 3 _or
    int sync_acc = 0;     // predicate count of __syncthreads_count/and/or
    int sync_result = 0;  // of the last completed phase
    unsigned long long progress = 0;
    std::atomic<bool> failed{false};
    std::string error;

    // fibers (serial schedules)
    bool fibers = false;
    std::unique_ptr<ucontext_t[]> fctx;
    ucontext_t sched_ctx;
    char* stacks = nullptr;
    size_t stacks_bytes = 0;
    static inline thread_local Launch* t_fiber_launch = nullptr;

    // -- errors ------------------------------------------------------------------
    std::string where() const {
        return std::string(kernel) + ", block (" + std::to_string(cur_block.x) + "," +
               std::to_string(cur_block.y) + "," + std::to_string(cur_block.z) + ")";
    }
    void fail_locked(const std::string& msg) {
        if (!failed.load()) {
            error = where() + ": " + msg;
            failed.store(true);
        }
        for (int i = 0; i < nthreads; ++i) thr[i].cv.notify_all();
        launcher_cv.notify_all();
    }
    [[noreturn]] void fail_throw(std::unique_lock<std::mutex>& lk, const std::string& msg) {
        fail_locked(msg);
        lk.unlock();
        throw KernelAbort{};
    }
    static std::string ranges(const std::vector<int>& ids) {
        std::string s;
        for (size_t i = 0; i < ids.size();) {
            size_t j = i;
            while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
            if (!s.empty()) s += ",";
            s += std::to_string(ids[i]);
            if (j > i) s += "-" + std::to_string(ids[j]);
            i = j + 1;
        }
        return s;
    }
    //! Which threads wait where (for deadlock messages).
    std::string describe_waits() const {
        std::vector<std::pair<Site, std::vector<int>>> groups;
        std::vector<int> exited;
        for (int i = 0; i < nthreads; ++i) {
            const ThreadState s = thr[i].state;
            if (s == EXITED) {
                exited.push_back(i);
            } else if (s == WAIT_SYNC || s == WAIT_WARP) {
                auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == thr[i].site; });
                if (it == groups.end()) groups.push_back({thr[i].site, {i}});
                else it->second.push_back(i);
            }
        }
        std::string s;
        for (auto& g : groups) s += "\n  threads " + ranges(g.second) + " wait at " + g.first.str();
        if (!exited.empty()) s += "\n  threads " + ranges(exited) + " have returned";
        return s;
    }

    // -- scheduling ----------------------------------------------------------------
    //! Make a waiting thread runnable again (its barrier completed).
    void release_locked(int i) {
        if (schedule == PARALLEL) {
            thr[i].state = RUN;
            ++active;
            thr[i].cv.notify_all();
        } else {
            thr[i].state = READY;
        }
    }
    //! Serial schedules: hand the token to the next READY thread (by the order).
    void schedule_next_locked() {
        int pick = -1, n_ready = 0;
        for (int i = 0; i < nthreads; ++i) {
            if (thr[i].state != READY) continue;
            ++n_ready;
            if (schedule == FORWARD) {
                if (pick < 0) pick = i;
            } else if (schedule == REVERSE) {
                pick = i;
            } else if (std::uniform_int_distribution<int>(1, n_ready)(rng) == 1) {
                pick = i;  // reservoir sampling: uniform over the READY threads
            }
            if (schedule == FORWARD) break;
        }
        running = pick;
        if (pick >= 0) {
            thr[pick].state = RUN;
            active = 1;
            thr[pick].cv.notify_all();
        } else {
            active = 0;
            if (live > 0) fail_locked("deadlock: no thread can proceed" + describe_waits());
        }
    }
    //! The calling thread stops running (it waits at a barrier or yields).
    void park_locked(std::unique_lock<std::mutex>& lk, int me) {
        if (schedule == PARALLEL) {
            if (thr[me].state != RUN) {
                --active;
                if (active == 0 && live > 0) fail_locked("deadlock: no thread can proceed" + describe_waits());
            }
        } else {
            if (thr[me].state == RUN) thr[me].state = READY;  // a yield: stays runnable
            schedule_next_locked();
            if (fibers && (thr[me].state != RUN || failed.load())) {
                // Switch straight to the thread picked to run (or, after a failure,
                // to the scheduler, which unwinds the block). The lock is never
                // held across a switch: one fiber runs at a time.
                const int r = failed.load() ? -1 : running;
                lk.unlock();
                if (r >= 0) {
                    enter_fiber_tls(r);
                    swapcontext(&fctx[me], &fctx[r]);
                } else {
                    swapcontext(&fctx[me], &sched_ctx);
                }
                lk.lock();
            }
        }
        while (thr[me].state != RUN && !failed.load()) thr[me].cv.wait(lk);
        if (failed.load()) {
            lk.unlock();
            throw KernelAbort{};
        }
    }
    std::unique_lock<std::mutex> enter() {
        std::unique_lock<std::mutex> lk(m);
        if (failed.load()) {
            lk.unlock();
            throw KernelAbort{};
        }
        ++progress;
        return lk;
    }

    // -- __syncthreads ---------------------------------------------------------------
    //! Every live thread has arrived: release the waiters (all but `except`).
    void complete_sync_locked(int except) {
        sync_result = sync_kind == 1 ? sync_acc : sync_kind == 2 ? (sync_acc == sync_arrived) : (sync_acc > 0);
        sync_arrived = 0;
        for (int i = 0; i < nthreads; ++i)
            if (i != except && thr[i].state == WAIT_SYNC) release_locked(i);
    }
    int sync(const Site& site, int kind, int pred) {
        const int me = t_ctx.tid;
        auto lk = enter();
        const WarpRec& w = warps[t_ctx.warp];
        if (w.arrived > 0)
            fail_throw(lk, "thread " + std::to_string(me) + " reached " + site.str() + " while lanes of its warp wait at " +
                               w.site.str() + " (divergent warp)" + describe_waits());
        if (sync_arrived == 0) {
            sync_site = site;
            sync_kind = kind;
            sync_acc = 0;
        } else if (!(sync_site == site)) {
            fail_throw(lk, "divergent __syncthreads: thread " + std::to_string(me) + " reached " + site.str() +
                               " while others wait at " + sync_site.str() +
                               " (every thread of the block must reach the same __syncthreads)" + describe_waits());
        }
        sync_acc += pred != 0;
        ++sync_arrived;
        thr[me].site = site;
        if (sync_arrived == live) {
            complete_sync_locked(me);
            if (schedule != PARALLEL) park_locked(lk, me);  // yield: the order picks who runs next
            return sync_result;
        }
        thr[me].state = WAIT_SYNC;
        park_locked(lk, me);
        return sync_result;
    }

    // -- warp intrinsics ---------------------------------------------------------------
    //! Exchange one 64-bit value per lane among the 32 lanes of the caller's warp.
    void warp_exchange(const Site& site, unsigned mask, int width, unsigned long long mine, unsigned long long out[32]) {
        const int me = t_ctx.tid, lane = t_ctx.lane;
        auto lk = enter();
        WarpRec& w = warps[t_ctx.warp];
        const std::string who = "lane " + std::to_string(lane) + " of warp " + std::to_string(t_ctx.warp) + " (thread " +
                                std::to_string(me) + ") at " + site.str();
        if (mask != 0xFFFFFFFFu)
            fail_throw(lk, who + ": only the full mask 0xFFFFFFFF is supported, got " + std::to_string(mask));
        if (width < 1 || width > 32 || (width & (width - 1)) != 0)
            fail_throw(lk, who + ": width must be a power of 2 <= 32, got " + std::to_string(width));
        if (w.lanes != 32)
            fail_throw(lk, who + ": full-mask warp intrinsic in a warp of " + std::to_string(w.lanes) +
                               " threads (block size " + std::to_string(nthreads) + " is not a multiple of 32)");
        if (w.live != 32)
            fail_throw(lk, who + ": full-mask warp intrinsic after " + std::to_string(32 - w.live) +
                               " lane(s) of the warp returned" + describe_waits());
        for (int i = t_ctx.warp * 32; i < t_ctx.warp * 32 + 32; ++i)
            if (thr[i].state == WAIT_SYNC)
                fail_throw(lk, who + " while thread " + std::to_string(i) + " of the warp waits at " +
                                   thr[i].site.str() + " (divergent warp)" + describe_waits());
        if (w.arrived == 0) {
            w.site = site;
            w.width = width;
        } else if (!(w.site == site) || w.width != width) {
            fail_throw(lk, who + " while other lanes wait at " + w.site.str() + " (width " + std::to_string(w.width) +
                               "): the lanes of a warp must call the same intrinsic (divergent warp)" +
                               describe_waits());
        }
        const int p = w.parity;
        w.slot[p][lane] = mine;
        ++w.arrived;
        thr[me].site = site;
        if (w.arrived == 32) {
            w.arrived = 0;
            w.parity ^= 1;
            for (int i = t_ctx.warp * 32; i < t_ctx.warp * 32 + 32; ++i)
                if (i != me && thr[i].state == WAIT_WARP) release_locked(i);
            if (schedule != PARALLEL) park_locked(lk, me);
        } else {
            thr[me].state = WAIT_WARP;
            park_locked(lk, me);
        }
        // slot[p] is rewritten only by the intrinsic after next, which no lane
        // can reach before every lane has read this one.
        std::memcpy(out, w.slot[p], sizeof(w.slot[p]));
    }

    // -- thread exit -------------------------------------------------------------------
    void exit_thread(int me) {
        std::unique_lock<std::mutex> lk(m);
        ++progress;
        const bool was_running = thr[me].state == RUN;
        thr[me].state = EXITED;
        --live;
        WarpRec& w = warps[me / 32];
        --w.live;
        if (!failed.load() && w.arrived > 0)
            fail_locked("thread " + std::to_string(me) + " returned while " + std::to_string(w.arrived) +
                        " lane(s) of its warp wait at " + w.site.str() + describe_waits());
        if (live == 0) {
            active = 0;
            running = -1;
            launcher_cv.notify_all();
            return;
        }
        if (failed.load()) return;
        if (sync_arrived > 0 && sync_arrived == live) complete_sync_locked(-1);  // the exited thread no longer counts
        if (schedule == PARALLEL) {
            if (was_running) --active;
            if (active == 0) fail_locked("deadlock: no thread can proceed" + describe_waits());
        } else {
            schedule_next_locked();
        }
    }

    // -- the launch --------------------------------------------------------------------
    void worker(int me) {
        t_ctx = ThreadCtx{this, me, me / 32, me % 32};
        t_threadIdx = ::uint3{me % block.x, (me / block.x) % block.y, me / (block.x * block.y)};
        t_blockDim = block;
        t_gridDim = grid;
        unsigned long long seen = 0;
        for (;;) {
            {
                std::unique_lock<std::mutex> lk(m);
                // Serial schedules start a thread when it is picked; after a failure
                // the threads not yet started leave the block without running.
                while (!stop && (block_gen == seen || (thr[me].state != RUN && !failed.load()))) thr[me].cv.wait(lk);
                if (stop) return;
                seen = block_gen;
                t_blockIdx = cur_block;
            }
            run_body(me);
        }
    }

    //! One CUDA thread's kernel body, then its exit (both execution modes).
    void run_body(int me) {
        if (!failed.load()) {
            try {
                invoke(args);
            } catch (const KernelAbort&) {
            } catch (const std::exception& e) {
                std::unique_lock<std::mutex> lk(m);
                fail_locked(std::string("a kernel thread threw ") + e.what());
            } catch (...) {
                std::unique_lock<std::mutex> lk(m);
                fail_locked("a kernel thread threw an exception");
            }
        }
        exit_thread(me);
    }

    // -- fibers ----------------------------------------------------------------------
    static void fiber_entry(int me) {
        Launch* L = t_fiber_launch;
        L->run_body(me);
        // returning resumes uc_link: the scheduler
    }
    void enter_fiber_tls(int me) {
        t_ctx = ThreadCtx{this, me, me / 32, me % 32};
        t_threadIdx = ::uint3{me % block.x, (me / block.x) % block.y, me / (block.x * block.y)};
        t_blockIdx = cur_block;
    }
    bool alloc_fibers() {
        const size_t page = 4096, per = kFiberStack + page;
        stacks_bytes = per * size_t(nthreads);
        void* p = mmap(nullptr, stacks_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (p == MAP_FAILED) return false;
        stacks = static_cast<char*>(p);
        for (int i = 0; i < nthreads; ++i) mprotect(stacks + per * size_t(i), page, PROT_NONE);  // overflow traps
        fctx.reset(new ucontext_t[nthreads]);
        return true;
    }
    //! Runs one block's fibers to completion (the lock is held on entry and exit).
    void run_block_fibers(std::unique_lock<std::mutex>& lk) {
        const size_t page = 4096, per = kFiberStack + page;
        for (int i = 0; i < nthreads; ++i) {
            getcontext(&fctx[i]);
            fctx[i].uc_stack.ss_sp = stacks + per * size_t(i) + page;
            fctx[i].uc_stack.ss_size = kFiberStack;
            fctx[i].uc_link = &sched_ctx;
            makecontext(&fctx[i], reinterpret_cast<void (*)()>(&Launch::fiber_entry), 1, i);
        }
        t_fiber_launch = this;
        while (live > 0) {
            int r = running;
            if (failed.load() || r < 0) {  // unwind: resume every thread still in the block
                r = -1;
                for (int i = 0; i < nthreads && r < 0; ++i)
                    if (thr[i].state != EXITED) r = i;
                if (r < 0) break;
            }
            enter_fiber_tls(r);
            lk.unlock();
            swapcontext(&sched_ctx, &fctx[r]);
            lk.lock();
        }
        t_ctx = ThreadCtx{};
    }
    //! Fibers run on the launching thread, so the watchdog needs a thread of its own.
    void watchdog(const bool* done) {
        std::unique_lock<std::mutex> lk(m);
        watch(lk, [done] { return *done; });
    }

    void poison_bytes(unsigned char* p, size_t n) {
        if (poison < 0 || n == 0) return;
#ifdef __SANITIZE_ADDRESS__
        // The shared-memory section also holds AddressSanitizer's redzones
        // between the variables: fill only the bytes that belong to them.
        for (size_t i = 0; i < n; ++i)
            if (!__asan_address_is_poisoned(p + i)) p[i] = poison < 256 ? (unsigned char)poison : (unsigned char)rng();
        return;
#endif
        if (poison < 256) {
            std::memset(p, poison, n);
            return;
        }
        for (size_t i = 0; i < n; i += 8) {
            const unsigned long long r = rng();
            std::memcpy(p + i, &r, std::min<size_t>(8, n - i));
        }
    }

    //! Returns "" or the error message.
    std::string run(unsigned long long seed) {
        rng.seed(seed);
        nthreads = int(block.x * block.y * block.z);
        nwarps = (nthreads + 31) / 32;
        thr.reset(new ThreadRec[nthreads]);
        warps.assign(nwarps, WarpRec{});
        std::unique_ptr<unsigned char, void (*)(void*)> dynbuf(
            static_cast<unsigned char*>(std::malloc(dyn_bytes + 2 * kGuard)), std::free);
        if (!dynbuf) return "cannot allocate dynamic shared memory";
        dyn = dynbuf.get() + kGuard;
        std::memset(dynbuf.get(), kGuardByte, dyn_bytes + 2 * kGuard);

        const long long nblocks = (long long)grid.x * grid.y * grid.z;
        std::vector<long long> order;
        order.reserve(size_t(nblocks));
        for (long long b = 0; b < nblocks; ++b) order.push_back(b);
        if (schedule == REVERSE) std::reverse(order.begin(), order.end());
        if (schedule == RANDOM) std::shuffle(order.begin(), order.end(), rng);

        fibers = GPUIR_HOST_FIBERS && schedule != PARALLEL;
        std::vector<std::thread> pool;
        bool done = false;
        std::thread dog;
        if (fibers) {
            if (!alloc_fibers()) return "cannot allocate fiber stacks for " + std::to_string(nthreads) + " threads";
            t_blockDim = block;
            t_gridDim = grid;
            dog = std::thread(&Launch::watchdog, this, &done);
        } else {
            pool.reserve(size_t(nthreads));
            try {
                for (int i = 0; i < nthreads; ++i) pool.emplace_back(&Launch::worker, this, i);
            } catch (const std::exception& e) {
                std::unique_lock<std::mutex> lk(m);
                fail_locked(std::string("cannot start ") + std::to_string(nthreads) + " threads: " + e.what());
            }
        }
        for (long long b : order) {
            std::unique_lock<std::mutex> lk(m);
            if (failed.load()) break;
            cur_block = ::uint3{unsigned(b % grid.x), unsigned((b / grid.x) % grid.y),
                                unsigned(b / ((long long)grid.x * grid.y))};
            poison_bytes(dyn, dyn_bytes);
            if (__gpuir_shared_start && __gpuir_shared_end)
                poison_bytes(reinterpret_cast<unsigned char*>(__gpuir_shared_start),
                             size_t(__gpuir_shared_end - __gpuir_shared_start));
            live = nthreads;
            sync_arrived = 0;
            for (int w = 0; w < nwarps; ++w) {
                warps[w] = WarpRec{};
                warps[w].lanes = std::min(32, nthreads - 32 * w);
                warps[w].live = warps[w].lanes;
            }
            ++block_gen;
            if (schedule == PARALLEL) {
                active = nthreads;
                for (int i = 0; i < nthreads; ++i) {
                    thr[i].state = RUN;
                    thr[i].cv.notify_all();
                }
            } else {
                for (int i = 0; i < nthreads; ++i) thr[i].state = READY;
                schedule_next_locked();
            }
            if (fibers) run_block_fibers(lk);
            else wait_block(lk);
            if (!failed.load()) check_guard();
        }
        {
            std::unique_lock<std::mutex> lk(m);
            stop = true;
            done = true;
            for (int i = 0; i < nthreads; ++i) thr[i].cv.notify_all();
            launcher_cv.notify_all();
        }
        for (auto& t : pool) t.join();
        if (dog.joinable()) dog.join();
        if (stacks) munmap(stacks, stacks_bytes);
        return failed.load() ? error : std::string();
    }

    void wait_block(std::unique_lock<std::mutex>& lk) {
        watch(lk, [this] { return live == 0; });
    }

    //! Waits (lock held) until `finished()`; fails the launch after `timeout_s`
    //! without progress, and aborts the process if its threads then do not stop.
    template <class F>
    void watch(std::unique_lock<std::mutex>& lk, F finished) {
        using clock = std::chrono::steady_clock;
        unsigned long long last = progress;
        auto since = clock::now();
        while (!finished()) {
            launcher_cv.wait_for(lk, std::chrono::milliseconds(100));
            if (finished()) break;
            if (progress != last) {
                last = progress;
                since = clock::now();
                continue;
            }
            const double idle = std::chrono::duration<double>(clock::now() - since).count();
            if (!failed.load() && idle > timeout_s) {
                fail_locked("no progress for " + std::to_string(int(timeout_s)) +
                            " s: a thread loops forever or spins on another thread or block "
                            "(only __syncthreads and warp intrinsics synchronise here)" + describe_waits());
                since = clock::now();
            } else if (failed.load() && idle > 10.0) {
                std::fprintf(stderr, "gpuir cuda_host: %s\n%d kernel thread(s) did not stop; aborting.\n",
                             error.c_str(), live);
                std::fflush(stderr);
                std::abort();
            }
        }
    }

    void check_guard() {
        const unsigned char* lo = dyn - kGuard;
        const unsigned char* hi = dyn + dyn_bytes;
        for (size_t i = 0; i < kGuard; ++i) {
            if (lo[i] != kGuardByte || hi[i] != kGuardByte) {
                fail_locked("the kernel wrote outside its " + std::to_string(dyn_bytes) +
                            " bytes of dynamic shared memory (at byte " +
                            std::to_string(lo[i] != kGuardByte ? (long long)i - (long long)kGuard
                                                               : (long long)(dyn_bytes + i)) + ")");
                return;
            }
        }
    }
};

inline void* dynamic_shared() { return t_ctx.L->dyn; }

inline void check_abort() {
    if (t_ctx.L && t_ctx.L->failed.load(std::memory_order_relaxed)) throw KernelAbort{};
}

template <class T>
inline unsigned long long to_bits(T v) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp intrinsics take values of at most 8 bytes");
    unsigned long long u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T>
inline T from_bits(unsigned long long u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}

//! Calls a kernel with its arguments unpacked from an array of pointers to them.
template <class... P, std::size_t... I>
inline void invoke_impl(void (*f)(P...), void** a, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<P>*>(a[I])...);
}
template <class... P>
inline void invoke(void (*f)(P...), void** a) {
    invoke_impl(f, a, std::index_sequence_for<P...>{});
}

//! NumPy dtype string of a parameter type ("i4", "f8", ...; "V<n>" for other types).
template <class T>
inline void type_code(std::string& s) {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, bool>) {
        s += "b1";
    } else if constexpr (std::is_floating_point_v<U>) {
        s += "f" + std::to_string(sizeof(U));
    } else if constexpr (std::is_integral_v<U>) {
        s += (std::is_signed_v<U> ? "i" : "u") + std::to_string(sizeof(U));
    } else if constexpr (std::is_pointer_v<U>) {
        s += "P";
    } else if constexpr (std::is_void_v<U>) {
        s += "V0";
    } else {
        s += "V" + std::to_string(sizeof(U));
    }
}
//! Parameter list as "s:i4,p:f4,pc:u4": s scalar, p pointer, pc pointer to const.
template <class... P>
inline std::string signature(void (*)(P...)) {
    std::string s;
    auto one = [&s](auto tag) {
        using Q = typename decltype(tag)::type;
        if (!s.empty()) s += ",";
        if constexpr (std::is_pointer_v<Q>) {
            using E = std::remove_pointer_t<Q>;
            s += std::is_const_v<E> ? "pc:" : "p:";
            type_code<E>(s);
        } else {
            s += "s:";
            type_code<Q>(s);
        }
    };
    (one(std::type_identity<P>{}), ...);
    return s;
}

struct KernelEntry {
    const char* name;
    void (*invoke)(void**);
    std::string (*signature)();
};

inline int copy_out(const std::string& s, char* buf, unsigned long long n) {
    if (n == 0) return int(s.size());
    const size_t k = std::min<size_t>(s.size(), size_t(n - 1));
    std::memcpy(buf, s.data(), k);
    buf[k] = 0;
    return int(s.size());
}

//! The C entry point (see harness.py): 0 = ran, 1 = the kernel failed (message in err).
inline int launch(const KernelEntry& k, const unsigned* grid3, const unsigned* block3, unsigned long long shared,
                  void** args, int schedule, unsigned long long seed, int poison, double timeout_s, char* err,
                  unsigned long long errlen) {
    Launch L;
    L.kernel = k.name;
    L.invoke = k.invoke;
    L.args = args;
    L.grid = ::dim3(grid3[0], grid3[1], grid3[2]);
    L.block = ::dim3(block3[0], block3[1], block3[2]);
    L.dyn_bytes = size_t(shared);
    L.schedule = Schedule(schedule);
    L.poison = poison;
    L.timeout_s = timeout_s;
    const std::string e = L.run(seed);
    copy_out(e, err, errlen);
    return e.empty() ? 0 : 1;
}

}  // namespace gpuir_host

// ---------------------------------------------------------------------------
// Synchronisation and warp intrinsics
// ---------------------------------------------------------------------------
inline void __syncthreads(std::source_location loc = std::source_location::current()) {
    ::gpuir_host::t_ctx.L->sync(::gpuir_host::Site("__syncthreads", loc), 0, 0);
}
inline int __syncthreads_count(int pred, std::source_location loc = std::source_location::current()) {
    return ::gpuir_host::t_ctx.L->sync(::gpuir_host::Site("__syncthreads_count", loc), 1, pred);
}
inline int __syncthreads_and(int pred, std::source_location loc = std::source_location::current()) {
    return ::gpuir_host::t_ctx.L->sync(::gpuir_host::Site("__syncthreads_and", loc), 2, pred);
}
inline int __syncthreads_or(int pred, std::source_location loc = std::source_location::current()) {
    return ::gpuir_host::t_ctx.L->sync(::gpuir_host::Site("__syncthreads_or", loc), 3, pred);
}

inline void __syncwarp(unsigned mask = 0xFFFFFFFFu, std::source_location loc = std::source_location::current()) {
    unsigned long long v[32];
    ::gpuir_host::t_ctx.L->warp_exchange(::gpuir_host::Site("__syncwarp", loc), mask, 32, 0, v);
}

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,
                     std::source_location loc = std::source_location::current()) {
    unsigned long long v[32];
    ::gpuir_host::t_ctx.L->warp_exchange(::gpuir_host::Site("__shfl_sync", loc), mask, width,
                                         ::gpuir_host::to_bits(var), v);
    const int lane = ::gpuir_host::t_ctx.lane;
    return ::gpuir_host::from_bits<T>(v[(lane & ~(width - 1)) + (src_lane & (width - 1))]);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                        std::source_location loc = std::source_location::current()) {
    unsigned long long v[32];
    ::gpuir_host::t_ctx.L->warp_exchange(::gpuir_host::Site("__shfl_up_sync", loc), mask, width,
                                         ::gpuir_host::to_bits(var), v);
    const int lane = ::gpuir_host::t_ctx.lane;
    const int src = (lane & (width - 1)) >= (int)delta ? lane - (int)delta : lane;
    return ::gpuir_host::from_bits<T>(v[src]);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                          std::source_location loc = std::source_location::current()) {
    unsigned long long v[32];
    ::gpuir_host::t_ctx.L->warp_exchange(::gpuir_host::Site("__shfl_down_sync", loc), mask, width,
                                         ::gpuir_host::to_bits(var), v);
    const int lane = ::gpuir_host::t_ctx.lane;
    const int src = (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : lane;
    return ::gpuir_host::from_bits<T>(v[src]);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                         std::source_location loc = std::source_location::current()) {
    unsigned long long v[32];
    ::gpuir_host::t_ctx.L->warp_exchange(::gpuir_host::Site("__shfl_xor_sync", loc), mask, width,
                                         ::gpuir_host::to_bits(var), v);
    const int lane = ::gpuir_host::t_ctx.lane;
    const int src = lane ^ lane_mask;
    // A lane of a later group of `width` lanes returns the caller's own value.
    return ::gpuir_host::from_bits<T>(v[src >= (lane & ~(width - 1)) + width ? lane : (src & 31)]);
}

namespace gpuir_host {
inline unsigned ballot_bits(const char* what, unsigned mask, int pred, const std::source_location& loc) {
    unsigned long long v[32];
    t_ctx.L->warp_exchange(Site(what, loc), mask, 32, pred != 0, v);
    unsigned b = 0;
    for (int i = 0; i < 32; ++i) b |= unsigned(v[i] != 0) << i;
    return b;
}
template <class T, class F>
inline T warp_reduce(const char* what, unsigned mask, T value, F op, const std::source_location& loc) {
    unsigned long long v[32];
    t_ctx.L->warp_exchange(Site(what, loc), mask, 32, to_bits(value), v);
    T r = from_bits<T>(v[0]);
    for (int i = 1; i < 32; ++i) r = op(r, from_bits<T>(v[i]));
    return r;
}
}  // namespace gpuir_host

inline unsigned __ballot_sync(unsigned mask, int pred, std::source_location loc = std::source_location::current()) {
    return ::gpuir_host::ballot_bits("__ballot_sync", mask, pred, loc);
}
inline int __any_sync(unsigned mask, int pred, std::source_location loc = std::source_location::current()) {
    return ::gpuir_host::ballot_bits("__any_sync", mask, pred, loc) != 0u;
}
inline int __all_sync(unsigned mask, int pred, std::source_location loc = std::source_location::current()) {
    return ::gpuir_host::ballot_bits("__all_sync", mask, pred, loc) == 0xFFFFFFFFu;
}

#define GPUIR_HOST_REDUCE(NAME, T, EXPR)                                                                  \
    inline T NAME(unsigned mask, T value, std::source_location loc = std::source_location::current()) { \
        return ::gpuir_host::warp_reduce<T>(#NAME, mask, value, [](T a, T b) { return EXPR; }, loc);     \
    }
GPUIR_HOST_REDUCE(__reduce_add_sync, unsigned, a + b)
GPUIR_HOST_REDUCE(__reduce_add_sync, int, int((unsigned)a + (unsigned)b))
GPUIR_HOST_REDUCE(__reduce_min_sync, unsigned, a < b ? a : b)
GPUIR_HOST_REDUCE(__reduce_min_sync, int, a < b ? a : b)
GPUIR_HOST_REDUCE(__reduce_max_sync, unsigned, a > b ? a : b)
GPUIR_HOST_REDUCE(__reduce_max_sync, int, a > b ? a : b)
GPUIR_HOST_REDUCE(__reduce_and_sync, unsigned, a & b)
GPUIR_HOST_REDUCE(__reduce_or_sync, unsigned, a | b)
GPUIR_HOST_REDUCE(__reduce_xor_sync, unsigned, a ^ b)
#undef GPUIR_HOST_REDUCE

// ---------------------------------------------------------------------------
// Atomics (relaxed, as CUDA's; they also stop a spinning thread after a failure)
// ---------------------------------------------------------------------------
namespace gpuir_host {
template <class T>
inline std::atomic_ref<T> aref(T* p) {
    check_abort();
    return std::atomic_ref<T>(*p);
}
template <class T, class F>
inline T atomic_update(T* p, F f) {
    auto a = aref(p);
    T old = a.load(std::memory_order_relaxed);
    while (!a.compare_exchange_weak(old, f(old), std::memory_order_relaxed)) {
    }
    return old;
}
constexpr auto relaxed = std::memory_order_relaxed;
}  // namespace gpuir_host

#define GPUIR_HOST_FETCH(NAME, T, METHOD) \
    inline T NAME(T* p, T v) { return ::gpuir_host::aref(p).METHOD(v, ::gpuir_host::relaxed); }
#define GPUIR_HOST_UPDATE(NAME, T, EXPR) \
    inline T NAME(T* p, T v) { return ::gpuir_host::atomic_update(p, [v](T old) -> T { return EXPR; }); }
GPUIR_HOST_FETCH(atomicAdd, int, fetch_add)
GPUIR_HOST_FETCH(atomicAdd, unsigned int, fetch_add)
GPUIR_HOST_FETCH(atomicAdd, unsigned long long, fetch_add)
GPUIR_HOST_FETCH(atomicAdd, float, fetch_add)
GPUIR_HOST_FETCH(atomicAdd, double, fetch_add)
GPUIR_HOST_FETCH(atomicSub, int, fetch_sub)
GPUIR_HOST_FETCH(atomicSub, unsigned int, fetch_sub)
GPUIR_HOST_FETCH(atomicExch, int, exchange)
GPUIR_HOST_FETCH(atomicExch, unsigned int, exchange)
GPUIR_HOST_FETCH(atomicExch, unsigned long long, exchange)
GPUIR_HOST_FETCH(atomicExch, float, exchange)
GPUIR_HOST_FETCH(atomicAnd, int, fetch_and)
GPUIR_HOST_FETCH(atomicAnd, unsigned int, fetch_and)
GPUIR_HOST_FETCH(atomicAnd, unsigned long long, fetch_and)
GPUIR_HOST_FETCH(atomicOr, int, fetch_or)
GPUIR_HOST_FETCH(atomicOr, unsigned int, fetch_or)
GPUIR_HOST_FETCH(atomicOr, unsigned long long, fetch_or)
GPUIR_HOST_FETCH(atomicXor, int, fetch_xor)
GPUIR_HOST_FETCH(atomicXor, unsigned int, fetch_xor)
GPUIR_HOST_FETCH(atomicXor, unsigned long long, fetch_xor)
GPUIR_HOST_UPDATE(atomicMax, int, old > v ? old : v)
GPUIR_HOST_UPDATE(atomicMax, unsigned int, old > v ? old : v)
GPUIR_HOST_UPDATE(atomicMax, long long, old > v ? old : v)
GPUIR_HOST_UPDATE(atomicMax, unsigned long long, old > v ? old : v)
GPUIR_HOST_UPDATE(atomicMin, int, old < v ? old : v)
GPUIR_HOST_UPDATE(atomicMin, unsigned int, old < v ? old : v)
GPUIR_HOST_UPDATE(atomicMin, long long, old < v ? old : v)
GPUIR_HOST_UPDATE(atomicMin, unsigned long long, old < v ? old : v)
GPUIR_HOST_UPDATE(atomicInc, unsigned int, old >= v ? 0u : old + 1u)
GPUIR_HOST_UPDATE(atomicDec, unsigned int, (old == 0u || old > v) ? v : old - 1u)
#undef GPUIR_HOST_FETCH
#undef GPUIR_HOST_UPDATE

#define GPUIR_HOST_CAS(T)                                                                   \
    inline T atomicCAS(T* p, T compare, T val) {                                            \
        ::gpuir_host::aref(p).compare_exchange_strong(compare, val, ::gpuir_host::relaxed); \
        return compare;                                                                     \
    }
GPUIR_HOST_CAS(int)
GPUIR_HOST_CAS(unsigned int)
GPUIR_HOST_CAS(unsigned long long)
#undef GPUIR_HOST_CAS

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <class T>
inline T __ldg(const T* p) {
    return *p;
}

// ---------------------------------------------------------------------------
// Bit and arithmetic intrinsics
// ---------------------------------------------------------------------------
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned int __brev(unsigned int x) {
    unsigned int r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned long long __brevll(unsigned long long x) {
    return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

inline unsigned int __float_as_uint(float f) { return ::gpuir_host::from_bits<unsigned int>(::gpuir_host::to_bits(f)); }
inline int __float_as_int(float f) { return ::gpuir_host::from_bits<int>(::gpuir_host::to_bits(f)); }
inline float __uint_as_float(unsigned int u) { return ::gpuir_host::from_bits<float>(::gpuir_host::to_bits(u)); }
inline float __int_as_float(int u) { return ::gpuir_host::from_bits<float>(::gpuir_host::to_bits(u)); }
inline long long __double_as_longlong(double d) { return ::gpuir_host::from_bits<long long>(::gpuir_host::to_bits(d)); }
inline double __longlong_as_double(long long u) { return ::gpuir_host::from_bits<double>(::gpuir_host::to_bits(u)); }

// Round-to-nearest float operations: on x86-64 (SSE) every float operation
// rounds to float32, and -ffp-contract=off forbids contraction into FMA.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
// An approximate division, as the device's MUFU-based one: deliberately 2 ulps off (up or down by
// the quotient's low bit), so code that refines it (common.cuh: recip_f64) is tested against an
// estimate no better than the device's.
inline float __fdividef(float a, float b) {
    float q = a / b;
    if (!std::isfinite(q) || q == 0.0f) return q;
    const float dir = (::gpuir_host::from_bits<unsigned int>(::gpuir_host::to_bits(q)) & 1u) ? INFINITY : -INFINITY;
    return std::nextafter(std::nextafter(q, dir), dir);
}
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }

#define GPUIR_HOST_MINMAX(T, MIN, MAX) \
    inline T min(T a, T b) { return MIN; } \
    inline T max(T a, T b) { return MAX; }
GPUIR_HOST_MINMAX(int, a < b ? a : b, a > b ? a : b)
GPUIR_HOST_MINMAX(unsigned int, a < b ? a : b, a > b ? a : b)
GPUIR_HOST_MINMAX(long long, a < b ? a : b, a > b ? a : b)
GPUIR_HOST_MINMAX(unsigned long long, a < b ? a : b, a > b ? a : b)
GPUIR_HOST_MINMAX(float, fminf(a, b), fmaxf(a, b))
GPUIR_HOST_MINMAX(double, fmin(a, b), fmax(a, b))
#undef GPUIR_HOST_MINMAX
