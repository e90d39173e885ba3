#include "gpu/comm/group_membership.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mneme::gpu {

absl::StatusOr<std::unique_ptr<GroupMembership>> GroupMembership::Create(
    int rank, int size, GroupFactory factory) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " must be in [0, size=", size, ")"));
  }
  if (!factory) {
    return absl::InvalidArgumentError("the group factory is null");
  }
  return std::unique_ptr<GroupMembership>(
      new GroupMembership(rank, size, std::move(factory)));
}

GroupMembership::GroupMembership(int rank, int size, GroupFactory factory)
    : rank_(rank),
      size_(size),
      factory_(std::move(factory)),
      error_(absl::UnavailableError(
          "not in a tensor-parallel group yet (waiting for the coordinator "
          "to form one)")) {}

void GroupMembership::DropInner() {
  if (inner_ == nullptr) return;
  const CommStats s = inner_->stats();
  past_.calls += s.calls;
  past_.bytes += s.bytes;
  past_.time += s.time;
  inner_.reset();
}

absl::Status GroupMembership::Join(int64_t generation) {
  if (generation <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group generation ", generation, " must be positive"));
  }
  if (generation == generation_ && in_group()) return absl::OkStatus();
  DropInner();
  generation_ = generation;
  absl::StatusOr<std::unique_ptr<Communicator>> comm = factory_(generation);
  if (!comm.ok()) {
    error_ = absl::Status(comm.status().code(),
                          absl::StrCat("joining group generation ", generation,
                                       ": ", comm.status().message()));
    return error_;
  }
  if (*comm == nullptr || (*comm)->rank() != rank_ ||
      (*comm)->size() != size_) {
    error_ = absl::InternalError(
        absl::StrCat("the group factory made no communicator of rank ", rank_,
                     " of ", size_, " for generation ", generation));
    return error_;
  }
  inner_ = *std::move(comm);
  error_ = absl::OkStatus();
  return absl::OkStatus();
}

void GroupMembership::Leave(const absl::Status& why) {
  DropInner();
  error_ = why.ok() ? absl::UnavailableError("left the group") : why;
}

absl::Status GroupMembership::error() const { return error_; }

absl::StatusOr<Communicator*> GroupMembership::Current() const {
  if (!error_.ok()) return error_;
  if (inner_ == nullptr) return absl::UnavailableError("not in a group");
  return inner_.get();
}

absl::Status GroupMembership::Check(absl::Status st) {
  // Argument errors leave a communicator intact (Communicator); anything
  // else breaks the group until the next Join().
  if (!st.ok() && st.code() != absl::StatusCode::kInvalidArgument) {
    error_ = st;
  }
  return st;
}

absl::Status GroupMembership::AllReduceSum(float* data, int64_t count) {
  absl::StatusOr<Communicator*> c = Current();
  if (!c.ok()) return c.status();
  return Check((*c)->AllReduceSum(data, count));
}

absl::Status GroupMembership::AllGather(const float* in, int64_t count,
                                        float* out) {
  absl::StatusOr<Communicator*> c = Current();
  if (!c.ok()) return c.status();
  return Check((*c)->AllGather(in, count, out));
}

absl::Status GroupMembership::ReduceScatterSum(const float* in, int64_t count,
                                               float* out) {
  absl::StatusOr<Communicator*> c = Current();
  if (!c.ok()) return c.status();
  return Check((*c)->ReduceScatterSum(in, count, out));
}

absl::Status GroupMembership::Broadcast(float* data, int64_t count, int root) {
  absl::StatusOr<Communicator*> c = Current();
  if (!c.ok()) return c.status();
  return Check((*c)->Broadcast(data, count, root));
}

absl::Status GroupMembership::Barrier() {
  absl::StatusOr<Communicator*> c = Current();
  if (!c.ok()) return c.status();
  return Check((*c)->Barrier());
}

CommStats GroupMembership::stats() const {
  CommStats s = past_;
  if (inner_ != nullptr) {
    const CommStats now = inner_->stats();
    s.calls += now.calls;
    s.bytes += now.bytes;
    s.time += now.time;
  }
  return s;
}

}  // namespace mneme::gpu
