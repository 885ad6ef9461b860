// The closer thread: pops descriptors and closes them with no lock held.
#include "arbiter/loop/fd_reaper.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace quanta::arbiter {

struct FdReaper::State {
  std::mutex mu;
  std::condition_variable cv;
  std::condition_variable idle_cv;
  std::deque<int> queue;
  size_t closing = 0;
  bool stopping = false;
  bool finished = false;
};

namespace {

void run(const std::shared_ptr<FdReaper::State>& s) {
  pthread_setname_np(pthread_self(), "quanta-reaper");
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->cv.wait(lock, [&] { return s->stopping || !s->queue.empty(); });
    if (s->queue.empty()) break;
    const int fd = s->queue.front();
    s->queue.pop_front();
    s->closing = 1;
    lock.unlock();
    ::close(fd);
    lock.lock();
    s->closing = 0;
  }
  s->finished = true;
  s->idle_cv.notify_all();
}

}  // namespace

FdReaper::FdReaper() : state_(std::make_shared<State>()) {
  // The thread takes no signals: the arbiter's SIGTERM/SIGINT arrive through its signalfd.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  std::thread([s = state_] { run(s); }).detach();
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

FdReaper::~FdReaper() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->stopping = true;
  state_->cv.notify_one();
  state_->idle_cv.wait_for(lock, std::chrono::seconds(1), [&] { return state_->finished; });
}

void FdReaper::close_later(int fd) {
  if (fd < 0) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.push_back(fd);
  }
  state_->cv.notify_one();
}

size_t FdReaper::pending() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->queue.size() + state_->closing;
}

}  // namespace quanta::arbiter
