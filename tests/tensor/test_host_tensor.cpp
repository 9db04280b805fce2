// host_tensor, tensor_view and aligned_buffer: alignment, zeroing, shapes, ownership and the tensor concept.
#include <gradwire/concepts.hpp>
#include <gradwire/tensor/aligned_buffer.hpp>
#include <gradwire/tensor/flat_layout.hpp>
#include <gradwire/tensor/host_tensor.hpp>
#include <gradwire/tensor/shape.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "helpers/reference.hpp"

namespace {

namespace gt = gradwire::test;
using gradwire::aligned_buffer;
using gradwire::host_tensor;
using gradwire::shape;
using gradwire::tensor_view;

// --- the tensor concept -----------------------------------------------------------------
static_assert(gradwire::concepts::tensor<host_tensor<float>>);
static_assert(gradwire::concepts::tensor<host_tensor<double>>);
static_assert(gradwire::concepts::host_tensor_type<host_tensor<float>>);
static_assert(gradwire::concepts::tensor<tensor_view<float>>);
static_assert(gradwire::concepts::tensor<tensor_view<double>>);
static_assert(gradwire::concepts::host_tensor_type<tensor_view<double>>);
// The concept asks for data() convertible to value_type* (parameters are written
// through it). A read-only view's data() is const float*, so it is correctly *not* a
// tensor: it can be read from, but a strategy cannot hold parameters in it.
static_assert(std::is_same_v<tensor_view<const float>::value_type, float>);
static_assert(!gradwire::concepts::tensor<tensor_view<const float>>);
static_assert(!gradwire::concepts::tensor<const host_tensor<float>>);
static_assert(!gradwire::concepts::tensor<std::vector<float>>);

// --- views of owning tensors: like std::span, constness and element type are kept ------------
static_assert(std::is_convertible_v<host_tensor<float>&, tensor_view<float>>);
static_assert(std::is_convertible_v<host_tensor<float>&, tensor_view<const float>>);
static_assert(std::is_convertible_v<const host_tensor<float>&, tensor_view<const float>>);
static_assert(!std::is_constructible_v<tensor_view<float>, const host_tensor<float>&>);
static_assert(!std::is_constructible_v<tensor_view<double>, host_tensor<float>&>);
static_assert(!std::is_constructible_v<tensor_view<float>, host_tensor<double>&>);
static_assert(!std::is_convertible_v<std::span<float>, tensor_view<float>>);  // explicit, like a flat view should be

template <class T>
bool all_zero(std::span<const T> x) {
  return std::all_of(x.begin(), x.end(), [](T v) { return v == T(0); });
}

// A tensor's shape and storage agree on how many elements it holds.
template <class Tensor>
void require_consistent(const Tensor& t) {
  CAPTURE(t.shape().to_string(), t.size());
  CHECK(t.shape().elements() == t.size());
  REQUIRE(t.span().size() == t.size());
  REQUIRE(t.span().data() == t.data());
  if (t.size() == 0) REQUIRE(t.span().empty());
}

const std::vector<shape> shapes{{1}, {3}, {17}, {1000}, {4099}, {2, 3, 5}, {64, 65}, {7, 1, 9, 2}};

}  // namespace

TEMPLATE_TEST_CASE("host_tensor storage is 64-byte aligned and zero-initialised", "[tensor][host_tensor]", float,
                   double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const shape& s : shapes) {
    CAPTURE(s.to_string());
    {
      // Dirty a block of the same size first, so that fresh memory being zero by luck
      // (fresh pages from the OS) is less likely to hide a missing memset.
      host_tensor<T> dirty(s);
      rng.fill(dirty.span(), 1.0, 2.0);
    }
    const host_tensor<T> t(s);
    REQUIRE(t.size() == s.elements());
    REQUIRE(t.shape() == s);
    REQUIRE(t.data() != nullptr);
    REQUIRE(gt::is_aligned(t.data(), 64));
    REQUIRE(gt::is_aligned(t.data(), gradwire::buffer_alignment));
    REQUIRE(all_zero(t.span()));
    require_consistent(t);
  }
}

TEST_CASE("shape: extents, rank and element count", "[tensor][shape]") {
  const shape s{2, 3, 4};
  REQUIRE(s.rank() == 3);
  REQUIRE(s.elements() == 24);
  REQUIRE(s[0] == 2);
  REQUIRE(s[2] == 4);
  REQUIRE_THROWS_AS(s[3], gradwire::error);
  REQUIRE(std::vector<std::size_t>(s.extents().begin(), s.extents().end()) == std::vector<std::size_t>{2, 3, 4});
  REQUIRE(s.to_string() == "[2, 3, 4]");
  REQUIRE(shape(std::vector<std::size_t>{2, 3, 4}) == s);
  REQUIRE(shape{3, 2, 4} != s);
  // Documented: a rank-0 shape is a scalar and holds one element.
  REQUIRE(shape{}.rank() == 0);
  REQUIRE(shape{}.elements() == 1);
  REQUIRE(shape{}.to_string() == "[]");
  // Any zero extent empties the shape.
  REQUIRE(shape{3, 0, 2}.elements() == 0);
  REQUIRE(shape{0}.elements() == 0);
}

TEMPLATE_TEST_CASE("host_tensor shape() and size(), including rank 0 and zero extents", "[tensor][host_tensor]", float,
                   double) {
  using T = TestType;
  const host_tensor<T> cube(shape{2, 3, 4});
  REQUIRE(cube.size() == 24);
  REQUIRE(cube.shape().rank() == 3);
  REQUIRE(cube.shape() == shape{2, 3, 4});
  require_consistent(cube);

  const host_tensor<T> scalar(shape{});  // rank 0: one element, like shape::elements says
  REQUIRE(scalar.size() == 1);
  REQUIRE(scalar.shape().rank() == 0);
  REQUIRE(scalar.data() != nullptr);
  REQUIRE(scalar[0] == T(0));
  require_consistent(scalar);

  const host_tensor<T> empty(shape{3, 0, 2});
  REQUIRE(empty.size() == 0);
  REQUIRE(empty.shape() == shape{3, 0, 2});
  require_consistent(empty);
}

TEMPLATE_TEST_CASE("host_tensor element access reads and writes its storage", "[tensor][host_tensor]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  host_tensor<T> t(shape{5, 7});
  const auto values = rng.vector<T>(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = values[i];
  REQUIRE(std::equal(values.begin(), values.end(), t.data()));
  REQUIRE(std::equal(values.begin(), values.end(), t.span().begin()));
  const host_tensor<T>& ct = t;
  for (std::size_t i = 0; i < t.size(); ++i) REQUIRE(ct[i] == values[i]);
}

TEMPLATE_TEST_CASE("host_tensor copies are deep", "[tensor][host_tensor]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  host_tensor<T> original(shape{31, 3});
  rng.fill(original.span());
  const auto values = std::vector<T>(original.span().begin(), original.span().end());

  host_tensor<T> copy(original);
  REQUIRE(copy.shape() == original.shape());
  REQUIRE(copy.data() != original.data());
  REQUIRE(gt::is_aligned(copy.data(), 64));
  REQUIRE(std::equal(values.begin(), values.end(), copy.data()));
  rng.fill(copy.span(), 2.0, 3.0);  // writes to the copy stay in the copy
  REQUIRE(std::equal(values.begin(), values.end(), original.data()));

  host_tensor<T> assigned(shape{4});
  assigned = original;
  REQUIRE(assigned.shape() == original.shape());
  REQUIRE(assigned.size() == original.size());
  REQUIRE(assigned.data() != original.data());
  REQUIRE(std::equal(values.begin(), values.end(), assigned.data()));
  assigned[0] = T(42);
  REQUIRE(original[0] == values[0]);
  require_consistent(assigned);
}

TEMPLATE_TEST_CASE("host_tensor move transfers the storage and leaves the source empty", "[tensor][host_tensor]",
                   float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  host_tensor<T> source(shape{10, 10});
  rng.fill(source.span());
  const auto values = std::vector<T>(source.span().begin(), source.span().end());
  const T* storage = source.data();

  host_tensor<T> moved(std::move(source));
  REQUIRE(moved.data() == storage);  // no copy was made
  REQUIRE(moved.shape() == shape{10, 10});
  REQUIRE(std::equal(values.begin(), values.end(), moved.data()));
  // The source must be safe to use: nothing to read, and nothing claiming otherwise.
  CHECK(source.data() == nullptr);   // NOLINT(bugprone-use-after-move)
  CHECK(source.size() == 0);         // fails while aligned_buffer's move keeps size_
  CHECK(source.span().empty());
  CHECK(source.shape().elements() == 0);  // fails while the moved-from shape reads as a rank-0 scalar

  host_tensor<T> target(shape{3});
  target = std::move(moved);
  REQUIRE(target.data() == storage);
  REQUIRE(target.size() == 100);
  CHECK(moved.size() == 0);  // NOLINT(bugprone-use-after-move)
  CHECK(moved.span().empty());

  source = host_tensor<T>(shape{2});  // a moved-from tensor can be given new contents
  REQUIRE(source.size() == 2);
  require_consistent(source);
}

TEMPLATE_TEST_CASE("default-constructed host_tensor and tensor_view are empty", "[tensor][host_tensor][tensor_view]",
                   float, double) {
  using T = TestType;
  const host_tensor<T> t;
  REQUIRE(t.size() == 0);
  REQUIRE(t.data() == nullptr);
  REQUIRE(t.span().empty());
  // A default shape is rank 0, i.e. one element: an empty tensor must not report it.
  CHECK(t.shape().elements() == t.size());

  const tensor_view<T> v;
  REQUIRE(v.data() == nullptr);
  CHECK(v.size() == 0);  // else span() is {nullptr, 1}
  CHECK(v.span().empty());
}

TEMPLATE_TEST_CASE("tensor_view over a std::vector: writes reach the vector", "[tensor][tensor_view]", float,
                   double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  std::vector<T> data = rng.vector<T>(24);

  const tensor_view<T> flat(std::span<T>{data});
  REQUIRE(flat.data() == data.data());
  REQUIRE(flat.size() == data.size());
  REQUIRE(flat.shape() == shape{24});
  require_consistent(flat);

  const tensor_view<T> grid(data.data(), shape{2, 3, 4});
  REQUIRE(grid.size() == 24);
  REQUIRE(grid.shape().rank() == 3);
  require_consistent(grid);

  const auto fresh = rng.vector<T>(data.size(), 5.0, 6.0);
  for (std::size_t i = 0; i < data.size(); ++i) flat[i] = fresh[i];  // a const view still writes: shallow
  REQUIRE(data == fresh);
  std::fill(grid.span().begin(), grid.span().end(), T(-1));
  REQUIRE(std::all_of(data.begin(), data.end(), [](T x) { return x == T(-1); }));

  const std::vector<T>& cdata = data;
  const tensor_view<const T> read_only(std::span<const T>{cdata});
  REQUIRE(read_only.data() == data.data());
  data[5] = T(7);
  REQUIRE(read_only[5] == T(7));
  static_assert(std::is_same_v<decltype(read_only.data()), const T*>);

  tensor_view<T> copy = flat;  // views copy shallowly
  REQUIRE(copy.data() == flat.data());
}

TEMPLATE_TEST_CASE("tensor_view over a host_tensor, const and non-const", "[tensor][tensor_view]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  host_tensor<T> owner(shape{3, 11});

  const tensor_view<T> view = owner;
  REQUIRE(view.data() == owner.data());
  REQUIRE(view.shape() == owner.shape());
  REQUIRE(view.size() == owner.size());
  const auto values = rng.vector<T>(owner.size());
  for (std::size_t i = 0; i < values.size(); ++i) view[i] = values[i];
  for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(owner[i] == values[i]);

  const tensor_view<const T> read_only = owner;
  REQUIRE(read_only.data() == owner.data());
  owner[4] = T(3);
  REQUIRE(read_only[4] == T(3));

  const host_tensor<T>& const_owner = owner;
  const tensor_view<const T> from_const = const_owner;
  REQUIRE(from_const.data() == owner.data());
  REQUIRE(from_const.shape() == shape{3, 11});
  require_consistent(from_const);
}

TEST_CASE("tensor_view rejects null data for a shape with elements", "[tensor][tensor_view]") {
  const auto rejects = [](const char* extents) {
    return gt::is_error(gradwire::errc::invalid_argument, {"tensor_view", extents});
  };
  REQUIRE_THROWS_MATCHES(tensor_view<float>(nullptr, shape{3}), gradwire::error, rejects("[3]"));
  REQUIRE_THROWS_MATCHES(tensor_view<double>(nullptr, shape{2, 5}), gradwire::error, rejects("[2, 5]"));
  REQUIRE_THROWS_MATCHES(tensor_view<const float>(nullptr, shape{1}), gradwire::error, rejects("[1]"));
  // A rank-0 shape is a scalar: one element, so it needs data too.
  REQUIRE_THROWS_MATCHES(tensor_view<float>(nullptr, shape{}), gradwire::error, rejects("[]"));
  // No elements, no data needed.
  const tensor_view<float> empty(nullptr, shape{0});
  REQUIRE(empty.size() == 0);
  REQUIRE(empty.span().empty());
  REQUIRE_NOTHROW(tensor_view<double>(nullptr, shape{4, 0}));
}

TEMPLATE_TEST_CASE("aligned_buffer: aligned, zeroed, deep copies, moves that empty the source",
                   "[tensor][aligned_buffer]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : {1, 5, 16, 17, 1000, 4099}) {
    CAPTURE(n);
    aligned_buffer<T> a(n);
    REQUIRE(a.size() == n);
    REQUIRE(gt::is_aligned(a.data(), 64));
    REQUIRE(all_zero(std::as_const(a).span()));
    rng.fill(a.span());
    const auto values = std::vector<T>(a.data(), a.data() + n);

    aligned_buffer<T> b(a);
    REQUIRE(b.data() != a.data());
    REQUIRE(gt::is_aligned(b.data(), 64));
    b.data()[0] = T(9);
    REQUIRE(a.data()[0] == values[0]);

    aligned_buffer<T> c(std::move(a));
    REQUIRE(std::equal(values.begin(), values.end(), c.data()));
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move)
    CHECK(a.size() == 0);        // fails while the defaulted move copies size_
    CHECK(a.span().empty());
  }
  const aligned_buffer<T> none;
  REQUIRE(none.size() == 0);
  REQUIRE(none.data() == nullptr);
  const aligned_buffer<T> zero(0);
  REQUIRE(zero.size() == 0);
  REQUIRE(aligned_buffer<T>(zero).size() == 0);
}

TEMPLATE_TEST_CASE("aligned_buffer::reserve_discard only grows", "[tensor][aligned_buffer]", float, double) {
  using T = TestType;
  aligned_buffer<T> b(100);
  const T* first = b.data();
  for (const std::size_t smaller : {0, 1, 50, 99, 100}) {
    CAPTURE(smaller);
    b.reserve_discard(smaller);
    REQUIRE(b.data() == first);  // no reallocation
    REQUIRE(b.size() == 100);
  }
  b.reserve_discard(101);
  REQUIRE(b.size() >= 101);
  REQUIRE(gt::is_aligned(b.data(), 64));
  const std::size_t grown = b.size();
  const T* second = b.data();
  std::fill_n(b.data(), grown, T(1));  // the whole new size is usable
  b.reserve_discard(grown);
  b.reserve_discard(7);
  REQUIRE(b.size() == grown);
  REQUIRE(b.data() == second);
  b.reserve_discard(10 * grown);
  REQUIRE(b.size() >= 10 * grown);
  REQUIRE(gt::is_aligned(b.data(), 64));

  aligned_buffer<T> empty;
  empty.reserve_discard(0);
  REQUIRE(empty.size() == 0);
  empty.reserve_discard(3);
  REQUIRE(empty.size() >= 3);
  REQUIRE(empty.data() != nullptr);
}

// flat_layout: the library's one pack/unpack (buckets, central storage, accumulation).
TEST_CASE("flat_layout places tensors back to back in the given order, and refuses an order that is not a "
          "permutation of them, naming the counts or the tensor",
          "[tensor][flat_layout]") {
  const std::vector<std::size_t> sizes{3, 0, 2, 4};
  const std::vector<std::size_t> order{2, 0, 3, 1};  // 2 first, then 0, 3, and the empty 1
  const gradwire::flat_layout layout(sizes, order);
  CHECK(layout.tensor_count() == 4);
  CHECK(layout.total() == 9);
  // Offsets by hand: tensor 2 at 0, tensor 0 at 2, tensor 3 at 5, tensor 1 (empty) at 9.
  CHECK(std::vector<std::size_t>{layout.offset(0), layout.offset(1), layout.offset(2), layout.offset(3)} ==
        std::vector<std::size_t>{2, 9, 0, 5});
  CHECK(std::vector<std::size_t>{layout.position(0), layout.position(1), layout.position(2), layout.position(3)} ==
        std::vector<std::size_t>{1, 3, 0, 2});
  CHECK(std::ranges::equal(layout.order(), order));
  // Gather then scatter: every element lands at its offset and comes back.
  const std::vector<std::vector<float>> tensors{{1, 2, 3}, {}, {4, 5}, {6, 7, 8, 9}};
  std::vector<float> flat(9, -1.0f);
  layout.gather(tensors, std::span<float>(flat));
  CHECK(flat == std::vector<float>{4, 5, 1, 2, 3, 6, 7, 8, 9});
  std::vector<std::vector<float>> back{std::vector<float>(3), {}, std::vector<float>(2), std::vector<float>(4)};
  std::vector<std::span<float>> into(back.begin(), back.end());  // what the library scatters into: views
  layout.scatter(std::span<const float>(flat), into);
  CHECK(back == tensors);
  CHECK(layout.fits(tensors));
  CHECK_FALSE(layout.fits(std::vector<std::vector<float>>{{1, 2, 3}, {}, {4, 5}}));
  // Index order when none is given.
  CHECK(gradwire::flat_layout(sizes).offset(3) == 5);

  auto refusal = [&](std::vector<std::size_t> bad) {
    try {
      gradwire::flat_layout(sizes, bad);
    } catch (const gradwire::error& e) {
      CHECK(e.kind() == gradwire::errc::invalid_argument);
      return std::string(e.what());
    }
    FAIL("accepted an order that is not a permutation");
    return std::string();
  };
  CHECK_THAT(refusal({2, 0, 3}), Catch::StartsWith("flat_layout: an order of 3 tensors for 4"));
  CHECK_THAT(refusal({2, 0, 2, 1}),
             Catch::StartsWith("flat_layout: the order is not a permutation of 0..3 (tensor 2 at position 2)"));
  CHECK_THAT(refusal({2, 0, 4, 1}),
             Catch::StartsWith("flat_layout: the order is not a permutation of 0..3 (tensor 4 at position 2)"));
}
