// A first-in, first-out list that keeps its storage: the arbiter's logs over a sliding
// window (usage pieces, ended waits) add at the back and drop at the front on every
// decision pass, and a std::deque would allocate and free a block every few dozen entries.
// The ring grows (doubling) only when full, so once a log is as long as its window gets it
// allocates nothing.
#pragma once

#include <cstddef>
#include <iterator>
#include <utility>
#include <vector>

namespace quanta::arbiter {

template <typename T>
class Ring {
 public:
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  // 0 is the oldest entry.
  T& operator[](size_t i) { return slots_[(head_ + i) % slots_.size()]; }
  const T& operator[](size_t i) const { return slots_[(head_ + i) % slots_.size()]; }
  T& front() { return (*this)[0]; }
  const T& front() const { return (*this)[0]; }
  T& back() { return (*this)[count_ - 1]; }
  const T& back() const { return (*this)[count_ - 1]; }

  void push_back(T value) {
    if (count_ == slots_.size()) grow();
    slots_[(head_ + count_) % slots_.size()] = std::move(value);
    ++count_;
  }
  void pop_front() {
    head_ = (head_ + 1) % slots_.size();
    --count_;
  }
  void clear() { head_ = count_ = 0; }

  // Oldest to newest.
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    using pointer = const T*;
    using reference = const T&;
    const_iterator(const Ring* ring, size_t i) : ring_(ring), i_(i) {}
    reference operator*() const { return (*ring_)[i_]; }
    pointer operator->() const { return &(*ring_)[i_]; }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const const_iterator& other) const { return i_ == other.i_; }
    bool operator!=(const const_iterator& other) const { return i_ != other.i_; }

   private:
    const Ring* ring_;
    size_t i_;
  };
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, count_); }

 private:
  void grow() {
    std::vector<T> grown(slots_.empty() ? 16 : 2 * slots_.size());
    for (size_t i = 0; i < count_; ++i) grown[i] = std::move((*this)[i]);
    slots_ = std::move(grown);
    head_ = 0;
  }

  std::vector<T> slots_;
  size_t head_ = 0;
  size_t count_ = 0;
};

}  // namespace quanta::arbiter
