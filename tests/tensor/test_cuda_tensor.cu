// cuda_tensor and cuda_tensor_view: zeroed stream-ordered memory, round trips, deep copies, moves, refused host
// pointers, and a device that cannot hold a tensor.
#include <gradwire/kernels/cuda.cuh>
#include <gradwire/tensor/cuda_tensor.cuh>

#include <vector>

#include "helpers/reference.hpp"

namespace gw = gradwire;

TEMPLATE_TEST_CASE("cuda_tensor starts zeroed, round-trips host values and copies deeply", "[cuda][tensor]", float,
                   double, __half, __nv_bfloat16) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  gw::cuda::stream stream;
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000003}}) {
    CAPTURE(n);
    gw::cuda_tensor<T> t(gw::shape{n}, stream);
    REQUIRE(t.size() == n);
    REQUIRE(t.stream() == stream.get());
    std::vector<T> back(n, gw::cuda::from_compute<T>(1.0f));
    t.copy_to_host(back);
    for (const T& x : back) REQUIRE(static_cast<double>(gw::cuda::to_compute(x)) == 0.0);

    std::vector<T> values(n);
    for (auto& x : values) x = gw::cuda::from_compute<T>(static_cast<gw::cuda::compute_t<T>>(rng.uniform(-1, 1)));
    t.copy_from_host(values);
    gw::cuda_tensor<T> copy(t);
    t.copy_from_host(std::vector<T>(n, gw::cuda::from_compute<T>(2.0f)));  // the copy must not follow
    copy.copy_to_host(back);
    for (std::size_t i = 0; i < n; ++i)
      REQUIRE(gw::cuda::to_compute(back[i]) == gw::cuda::to_compute(values[i]));

    gw::cuda_tensor<T> moved(std::move(copy));
    REQUIRE(copy.size() == 0);
    REQUIRE(copy.data() == nullptr);
    REQUIRE(moved.size() == n);
  }
}

TEST_CASE("cuda_tensor refuses host spans of the wrong size", "[cuda][tensor]") {
  gw::cuda_tensor<float> t(gw::shape{2, 3});
  std::vector<float> five(5);
  REQUIRE_THROWS_MATCHES(t.copy_from_host(five), gw::error,
                         gw::test::error_matcher(gw::errc::invalid_argument, {"6 elements", "5"}));
  REQUIRE_THROWS_MATCHES(t.copy_to_host(five), gw::error, gw::test::error_matcher(gw::errc::invalid_argument, {"6"}));
}

TEST_CASE("cuda_tensor_view views device memory and refuses host memory", "[cuda][tensor]") {
  gw::cuda_tensor<float> owner(gw::shape{4, 4});
  gw::cuda_tensor_view<float> view(owner.data(), gw::shape{16});
  REQUIRE(view.data() == owner.data());
  REQUIRE(view.size() == 16);
  gw::cuda_tensor_view<float> implicit = owner;
  REQUIRE(implicit.shape() == owner.shape());
  std::vector<float> host(16);
  REQUIRE_THROWS_MATCHES((gw::cuda_tensor_view<float>(host.data(), gw::shape{16})), gw::error,
                         gw::test::error_matcher(gw::errc::invalid_argument, {"not device or managed memory"}));
  REQUIRE_THROWS_MATCHES((gw::cuda_tensor_view<float>(nullptr, gw::shape{16})), gw::error,
                         gw::test::error_matcher(gw::errc::invalid_argument, {"null data"}));
  REQUIRE_NOTHROW(gw::cuda_tensor_view<float>(nullptr, gw::shape{0}));
}

TEST_CASE("a cuda_tensor larger than the device is errc::device naming the call and the reason, and the next kernel "
          "launch is not blamed for it", "[cuda][tensor][oom]") {
  gw::cuda::stream stream;
  const std::size_t too_many = std::size_t{1} << 42;  // 16 TiB of floats: more than any GPU holds
  REQUIRE_THROWS_MATCHES((gw::cuda_tensor<float>(gw::shape{too_many}, stream)), gw::error,
                         gw::test::error_matcher(gw::errc::device, {"cuda_tensor: cudaMallocAsync",
                                                                    "cudaErrorMemoryAllocation", "out of memory"}));
  // The failed allocation must not linger as the runtime's last error: kernels check their
  // launch with cudaGetLastError(), and would report this out-of-memory as their own failure.
  const std::vector<float> values{1.0f, -2.0f, 3.5f, 0.25f, 8.0f};
  gw::cuda_tensor<float> t(gw::shape{values.size()}, values, stream);
  REQUIRE_NOTHROW(gw::kernels::cuda::scale(t.data(), 2.0f, t.size(), stream.get()));
  std::vector<float> back(values.size());
  t.copy_to_host(back);
  for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(back[i] == 2.0f * values[i]);
}
