#ifndef MNEME_GPU_COMM_GROUP_MEMBERSHIP_H_
#define MNEME_GPU_COMM_GROUP_MEMBERSHIP_H_

#include <cstdint>
#include <memory>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/comm/communicator.h"

namespace mneme::gpu {

// Forms the communicator of one group generation (e.g. a GlooCommunicator
// meeting under the store prefix ".../gen-<generation>/"); blocks until
// every rank joined or its timeout passed.
using GroupFactory =
    absl::AnyInvocable<absl::StatusOr<std::unique_ptr<Communicator>>(
        int64_t generation)>;

// A Communicator whose group can be left and re-formed without recreating
// what borrows it (the model keeps one pointer for its lifetime): the
// collectives go to the communicator of the generation joined last. Before
// the first Join(), after a failed Join() and after a collective failed
// (Communicator: the inner communicator is then broken), every collective
// returns Unavailable naming why, and in_group() is false. Join() of a new
// generation drops the old communicator (its connections) before forming
// the new one, so a restarted peer and the survivors meet in a group none of
// them has state in.
//
// rank() and size() are fixed. stats() add up over every generation.
// Thread-safety: one thread at a time, as Communicator says (the worker's
// step thread runs both collectives and Join()).
class GroupMembership final : public Communicator {
 public:
  // InvalidArgument for a rank outside [0, size) or a null factory.
  static absl::StatusOr<std::unique_ptr<GroupMembership>> Create(
      int rank, int size, GroupFactory factory);

  // Joins `generation` (> 0). Already in it: OK at once. Otherwise leaves
  // the current group and forms the new one; on failure the membership is
  // in no group and the error is returned (and kept for the collectives).
  absl::Status Join(int64_t generation);
  // Leaves the group (the collectives then fail with `why`).
  void Leave(const absl::Status& why);

  // Whether the last Join() succeeded and no collective failed since.
  bool in_group() const { return inner_ != nullptr && error_.ok(); }
  // The generation joined (or attempted) last; 0 before any.
  int64_t generation() const { return generation_; }
  // Why the membership is not in a group; OK when it is.
  absl::Status error() const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllGather(const float* in, int64_t count, float* out) override;
  absl::Status ReduceScatterSum(const float* in, int64_t count,
                                float* out) override;
  absl::Status Broadcast(float* data, int64_t count, int root) override;
  absl::Status Barrier() override;
  CommStats stats() const override;

 private:
  GroupMembership(int rank, int size, GroupFactory factory);
  // The inner communicator, or the error every collective returns now.
  absl::StatusOr<Communicator*> Current() const;
  // Keeps the first error of a collective (the group is then broken).
  absl::Status Check(absl::Status st);
  void DropInner();

  const int rank_;
  const int size_;
  GroupFactory factory_;
  std::unique_ptr<Communicator> inner_;
  int64_t generation_ = 0;
  absl::Status error_;
  // Stats of the communicators already dropped.
  CommStats past_;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_COMM_GROUP_MEMBERSHIP_H_
