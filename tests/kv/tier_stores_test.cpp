// Tier stores: host slots and the O_DIRECT/io_uring disk store, including the buffered
// fallback, injected faults and slot accounting.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "kv/disk_store.h"
#include "kv/host_store.h"
#include "tier_test_util.h"

namespace fdl::kv {
namespace {

constexpr size_t kBlock = 11520;  // not 4 KiB aligned: slots round up to 12288

TEST(HostStore, SlotsAreAlignedDistinctAndNeverOverCapacity) {
  HostStore h(kBlock, 3);
  EXPECT_EQ(h.slot_bytes(), 12288u);
  std::set<uint32_t> got;
  for (int i = 0; i < 3; ++i) {
    auto s = h.allocate();
    ASSERT_TRUE(s);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(h.slot_ptr(*s)) % kIoAlign, 0u);
    got.insert(*s);
    EXPECT_EQ(h.n_free() + h.n_used(), h.capacity());
  }
  EXPECT_EQ(got.size(), 3u);
  EXPECT_FALSE(h.allocate()) << "full store says so, never over-allocates";
  h.release(1);
  EXPECT_THROW(h.release(1), std::invalid_argument) << "double free caught";
  EXPECT_THROW(h.bytes(1), std::invalid_argument) << "no access to a free slot";
  EXPECT_THROW(HostStore(0, 1), std::invalid_argument);
}

TEST(HostStore, PinHookSeesTheWholeArenaOnce) {
  size_t pinned = 0, unpinned = 0;
  {
    HostStore h(kBlock, 4,
                {[&](void*, size_t n) { pinned += n; }, [&](void*, size_t n) { unpinned += n; }});
  }
  EXPECT_EQ(pinned, 4u * 12288u);
  EXPECT_EQ(unpinned, pinned);
}

DiskStoreOptions opts(const std::filesystem::path& dir, size_t cap = 8) {
  return {dir, kBlock, cap, 2, 4, false};
}

// Write distinct patterns to every slot (more transfers than queue depth), read them back.
void round_trip_all(DiskStore& d) {
  std::vector<AlignedBuffer> out, in;
  for (size_t i = 0; i < d.capacity(); ++i) {
    out.emplace_back(kBlock);
    in.emplace_back(kBlock);
    std::memset(out.back().data(), int(0x11 * (i + 1)), kBlock);
  }
  std::vector<DiskCompletion> done;
  for (size_t i = 0; i < d.capacity(); ++i) {
    auto s = d.allocate();
    ASSERT_TRUE(s);
    d.submit_write(*s, out[*s].data(), *s);
  }
  EXPECT_FALSE(d.allocate());
  d.wait(done, d.capacity());
  ASSERT_EQ(done.size(), d.capacity());
  for (auto& c : done) EXPECT_TRUE(c.ok()) << c.error;
  done.clear();
  for (uint32_t i = 0; i < d.capacity(); ++i) d.submit_read(i, in[i].data(), 100 + i);
  d.wait(done, d.capacity());
  ASSERT_EQ(done.size(), d.capacity());
  for (auto& c : done) {
    EXPECT_TRUE(c.ok());
    EXPECT_EQ(c.tag, 100u + c.slot);
    EXPECT_EQ(std::memcmp(in[c.slot].data(), out[c.slot].data(), kBlock), 0) << c.slot;
  }
  EXPECT_EQ(d.in_flight(), 0u);
}

TEST(DiskStore, DirectIoRoundTripOnRealDisk) {
  const auto dir = test::fresh_dir("disk-direct");
  DiskStore d(opts(dir));
  EXPECT_TRUE(d.direct_io()) << "the temp dir is on a real disk here: " << d.direct_io_note();
  EXPECT_EQ(d.slot_bytes(), 12288u);
  round_trip_all(d);
  // The files are unlinked at creation: nothing is left in the directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(DiskStore, FallsBackToBufferedIoWhenODirectIsRefused) {
  DiskStoreOptions o = opts(test::fresh_dir("disk-fallback"));
  o.refuse_direct_for_test = true;
  DiskStore d(o);
  EXPECT_FALSE(d.direct_io());
  EXPECT_NE(d.direct_io_note().find("buffered"), std::string::npos);
  round_trip_all(d);
}

TEST(DiskStore, TmpfsAgreesWithTheKernelAboutODirect) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const auto dir =
      std::filesystem::path("/dev/shm") / ("flashdllm-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // What the kernel says: newer kernels (6.6+) accept O_DIRECT on tmpfs, older refuse it.
  const auto probe = dir / "probe";
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  const bool kernel_direct = fd >= 0;
  if (fd >= 0) ::close(fd);
  std::filesystem::remove(probe);
  {
    DiskStore d(opts(dir));
    EXPECT_EQ(d.direct_io(), kernel_direct) << d.direct_io_note();
    if (!kernel_direct) {
      EXPECT_NE(d.direct_io_note().find("EINVAL"), std::string::npos);
    }
    round_trip_all(d);
  }
  std::filesystem::remove_all(dir);
}

TEST(DiskStore, InjectedFaultsAreReportedInCompletionsNotThrown) {
  DiskStore d(opts(test::fresh_dir("disk-faults"), 4));
  AlignedBuffer buf(kBlock);
  const uint32_t s = *d.allocate();
  std::vector<DiskCompletion> done;
  d.inject_fault(DiskOp::Write, DiskFault::Eio);
  d.submit_write(s, buf.data(), 1);
  d.submit_write(s, buf.data(), 2);  // the fault hits only the next one
  d.wait(done, 2);
  ASSERT_EQ(done.size(), 2u);
  for (auto& c : done) {
    if (c.tag == 1) {
      EXPECT_EQ(c.error, EIO);
    } else {
      EXPECT_TRUE(c.ok());
    }
  }
  done.clear();
  d.inject_fault(DiskOp::Read, DiskFault::Short);
  d.submit_read(s, buf.data(), 3);
  d.wait(done, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].short_io);
  EXPECT_FALSE(done[0].ok());
  done.clear();
  d.inject_fault(DiskOp::Write, DiskFault::NoSpace);
  d.submit_write(s, buf.data(), 4);
  d.wait(done, 1);
  EXPECT_EQ(done.at(0).error, ENOSPC);
}

TEST(DiskStore, BadInputIsAClearError) {
  const auto dir = test::fresh_dir("disk-bad");
  EXPECT_THROW(DiskStore({dir / "missing", kBlock, 4}), DiskStoreError);
  EXPECT_THROW(DiskStore({dir, 0, 4}), DiskStoreError);
  EXPECT_THROW(DiskStore({dir, kBlock, 0}), DiskStoreError);
  EXPECT_THROW(DiskStore({dir, kBlock, 4, 0}), DiskStoreError);
  DiskStore d({dir, kBlock, 4});
  AlignedBuffer buf(kBlock);
  EXPECT_THROW(d.submit_write(0, buf.data(), 0), std::invalid_argument) << "slot not allocated";
  const uint32_t s = *d.allocate();
  EXPECT_THROW(d.submit_write(s, buf.data() + 8, 0), std::invalid_argument) << "misaligned";
}

TEST(DiskStore, ReservationFailureIsReportedAtConstruction) {
  // More than the filesystem can hold: fallocate fails with ENOSPC up front.
  const auto dir = test::fresh_dir("disk-huge");
  EXPECT_THROW(DiskStore({dir, size_t(1) << 30, size_t(1) << 20}), DiskStoreError);
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

}  // namespace
}  // namespace fdl::kv
