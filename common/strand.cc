#include "common/strand.h"

#include <algorithm>
#include <utility>

namespace tessera {

ThreadPool::ThreadPool(int threads) {
  threads_.reserve(std::max(threads, 1));
  for (int i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { Run(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void ThreadPool::Run() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !tasks_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      // Drain before stopping: a task may post more (a strand's next batch), and those run too.
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void Strand::Post(std::function<void()> task) {
  bool schedule = false;
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
    schedule = !scheduled_;
    scheduled_ = true;
  }
  if (schedule) pool_->Post([this] { Drain(); });
}

void Strand::Drain() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      if (tasks_.empty()) {
        scheduled_ = false;
        return;
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace tessera
