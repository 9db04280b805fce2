// mirrored (N replicas x batch b) trains the Fashion-MNIST example's MLP to the same weights as
// one_device (batch N*b), for each optimizer in float and double; plus checks of the MLP's
// gradient and of the example's idx reader. The checks that the comparison notices wrong
// data, and hierarchical all-reduce, are in test_mirrored_equivalence_more.cpp.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "idx.hpp"  // examples/fashion_mnist: the reader checked below
#include "mirrored_equivalence_support.hpp"

using namespace gradwire::test::mirrored_equivalence;

TEMPLATE_TEST_CASE("mirrored with N replicas of batch b matches one_device with batch N*b", "[strategy][mirrored]",
                   (equivalence_case<float, gradwire::optim::sgd>),
                   (equivalence_case<float, gradwire::optim::momentum>),
                   (equivalence_case<double, gradwire::optim::adam>),
                   (equivalence_case<double, gradwire::optim::adamw>),
                   (equivalence_case<float, gradwire::optim::adam>),
                   (equivalence_case<float, gradwire::optim::adamw>)) {
  using T = typename TestType::scalar;
  run_settings s;
  s.replicas = GENERATE(2, 3, 4);
  CAPTURE(s.replicas, s.batch, s.steps, TestType::tolerance);
  const auto data = random_samples<T>(s.sizes, s.batch * s.replicas * s.steps, 1234 + s.replicas);
  const auto opt = make_optimizer<typename TestType::optimizer>();

  const auto reference = train_one_device(s, data, opt);
  // DistributedSampler's split: replica r takes samples [r*b, (r+1)*b) of each global batch.
  const auto replicas = train_mirrored(s, data, opt, [&](int step, int rank) {
    return Eigen::Index(step) * s.batch * s.replicas + Eigen::Index(rank) * s.batch;
  });

  // The training moved the weights far more than the tolerance.
  mlp<T> initial(s.sizes, s.seed);
  const double moved = max_relative_error(reference, snapshot(initial));
  CAPTURE(moved);
  REQUIRE(moved > 10 * TestType::tolerance);

  const double error = max_relative_error(replicas[0], reference);
  CAPTURE(error);
  CHECK(error <= TestType::tolerance);

  // All-reduce hands every replica the same bits, so the replicas agree exactly.
  for (std::size_t r = 1; r < replicas.size(); ++r) {
    CAPTURE(r);
    for (std::size_t t = 0; t < reference.size(); ++t) {
      CAPTURE(t);
      REQUIRE(replicas[r][t].size() == replicas[0][t].size());
      CHECK(std::memcmp(replicas[r][t].data(), replicas[0][t].data(), replicas[0][t].size() * sizeof(T)) == 0);
    }
  }
}

TEST_CASE("mlp gradient is the gradient of the mean loss (finite differences, double)", "[strategy][mlp]") {
  const layer_sizes sizes{.input = 7, .hidden1 = 6, .hidden2 = 5, .classes = 4};
  mlp<double> m(sizes, 3);
  // Non-zero biases, so their gradients pass through the ReLUs non-trivially.
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-0.1, 0.1);
  for (auto* b : {&m.b1(), &m.b2(), &m.b3()})
    for (Eigen::Index i = 0; i < b->size(); ++i) (*b)(i) = u(rng);
  const Eigen::Index batch = 9;
  mlp<double>::matrix x(sizes.input, batch);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = u(rng) * 10;
  std::vector<int> y(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int>(i % 4);

  // The loss against a direct per-sample computation.
  const double loss = m.loss_and_gradient(x, y);
  {
    double expected = 0;
    for (Eigen::Index j = 0; j < batch; ++j) {
      const Eigen::VectorXd h1 = (m.w1() * x.col(j) + m.b1()).cwiseMax(0.0);
      const Eigen::VectorXd h2 = (m.w2() * h1 + m.b2()).cwiseMax(0.0);
      const Eigen::VectorXd z = m.w3() * h2 + m.b3();
      expected += std::log(z.array().exp().sum()) - z(y[static_cast<std::size_t>(j)]);
    }
    CHECK(loss == Approx(expected / double(batch)).epsilon(1e-12));
  }

  auto params = m.parameter_views();
  auto grads = m.gradient_views();
  std::vector<std::vector<double>> analytic;
  for (const auto& g : grads) analytic.emplace_back(g.data(), g.data() + g.size());
  const double h = 1e-6;
  double worst = 0, scale = 0;
  for (std::size_t t = 0; t < params.size(); ++t) {
    for (std::size_t i = 0; i < params[t].size(); ++i) {
      const double saved = params[t][i];
      params[t][i] = saved + h;
      const double up = m.loss(x, y);
      params[t][i] = saved - h;
      const double down = m.loss(x, y);
      params[t][i] = saved;
      const double numeric = (up - down) / (2 * h);
      worst = std::max(worst, std::abs(numeric - analytic[t][i]));
      scale = std::max(scale, std::abs(numeric));
    }
  }
  CAPTURE(worst, scale);
  REQUIRE(scale > 1e-3);
  CHECK(worst <= 1e-7 * std::max(1.0, scale));
}

TEST_CASE("one_device sgd step updates the mlp's Eigen storage through its views", "[strategy][mlp]") {
  using model = mlp<float>;
  const layer_sizes sizes{.input = 20, .hidden1 = 16, .hidden2 = 12, .classes = 5};
  model m(sizes, 11);
  const auto data = random_samples<float>(sizes, 10, 12);
  const float lr = 0.5f;
  gradwire::one_device<gradwire::tensor_view<float>, gradwire::optim::sgd> strategy(
      m.parameter_views(), gradwire::optim::sgd({.lr = lr}));
  m.loss_and_gradient(data.x, data.y);
  const model::matrix expected_w1 = m.w1() - lr * m.grad_w1();
  const model::vector expected_b3 = m.b3() - lr * m.grad_b3();
  auto grads = m.gradient_views();
  strategy.step(grads);
  CHECK((m.w1() - expected_w1).cwiseAbs().maxCoeff() <= 1e-6f * expected_w1.cwiseAbs().maxCoeff());
  CHECK((m.b3() - expected_b3).cwiseAbs().maxCoeff() <= 1e-6f * expected_b3.cwiseAbs().maxCoeff());
  CHECK(m.grad_b3().cwiseAbs().maxCoeff() > 0);
}

// --- the example's idx reader ---------------------------------------------------------

namespace {

// A fresh directory, removed with everything in it at scope exit.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("gradwire-idx-test-" + std::to_string(rd()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

void put_be32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

std::vector<std::uint8_t> images_file(std::uint32_t count, std::uint32_t rows, std::uint32_t cols,
                                      std::size_t pixel_bytes) {
  std::vector<std::uint8_t> out;
  put_be32(out, fashion_mnist::idx_images_magic);
  put_be32(out, count);
  put_be32(out, rows);
  put_be32(out, cols);
  for (std::size_t i = 0; i < pixel_bytes; ++i) out.push_back(static_cast<std::uint8_t>((i * 7 + 3) % 256));
  return out;
}

std::vector<std::uint8_t> labels_file(const std::vector<std::uint8_t>& labels, std::uint32_t count) {
  std::vector<std::uint8_t> out;
  put_be32(out, fashion_mnist::idx_labels_magic);
  put_be32(out, count);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void write_gz(const std::filesystem::path& file, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(file.string().c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// what() of the std::runtime_error fn throws ("" if it throws none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

using Catch::Matchers::Contains;

}  // namespace

TEST_CASE("idx reader round-trips a small well-formed split", "[idx]") {
  temp_dir dir;
  const auto images = dir.path / "images.gz";
  const auto labels = dir.path / "labels.gz";
  const std::size_t pixels = 3 * 28 * 28;
  const auto image_bytes = images_file(3, 28, 28, pixels);
  write_gz(images, image_bytes);
  write_gz(labels, labels_file({9, 0, 4}, 3));

  const auto split = fashion_mnist::load_split<float>(images, labels);
  REQUIRE(split.images.rows() == 784);
  REQUIRE(split.images.cols() == 3);
  CHECK(split.labels == std::vector<int>{9, 0, 4});
  // Pixel k of image n sits at byte 16 + n*784 + k and is scaled to [0, 1].
  for (Eigen::Index n = 0; n < 3; ++n)
    for (Eigen::Index k = 0; k < 784; ++k)
      REQUIRE(split.images(k, n) == Approx(image_bytes[static_cast<std::size_t>(16 + n * 784 + k)] / 255.0));
}

TEST_CASE("idx reader names the path and the fix when the data is missing", "[idx]") {
  const std::string missing = "/nonexistent/gradwire-fashion-mnist";
  const std::string message = error_of([&] { fashion_mnist::load_fashion_mnist<float>(missing); });
  CHECK_THAT(message, Contains(missing) && Contains("apt-get install dataset-fashion-mnist") && Contains("--data"));

  temp_dir empty;  // the directory exists, the files do not
  const std::string no_file = error_of([&] { fashion_mnist::load_fashion_mnist<float>(empty.path); });
  CHECK_THAT(no_file, Contains((empty.path / "train-images-idx3-ubyte.gz").string()) &&
                          Contains("apt-get install dataset-fashion-mnist") && Contains("--data"));
}

TEST_CASE("idx reader rejects malformed files with the file name and the problem", "[idx]") {
  temp_dir dir;
  const auto file = dir.path / "bad-idx3-ubyte.gz";
  const auto labels = dir.path / "labels-idx1-ubyte.gz";
  auto read_images = [&] { fashion_mnist::read_idx_images(file); };

  SECTION("pixel data cut short") {
    write_gz(file, images_file(3, 28, 28, 28 * 28 + 100));
    CHECK_THAT(error_of(read_images), Contains(file.string()) && Contains("truncated"));
  }
  SECTION("header cut short") {
    auto bytes = images_file(3, 28, 28, 0);
    bytes.resize(10);
    write_gz(file, bytes);
    CHECK_THAT(error_of(read_images), Contains(file.string()) && Contains("truncated") && Contains("header"));
  }
  SECTION("garbage instead of an idx file (compressed)") {
    std::vector<std::uint8_t> garbage(5000);
    std::mt19937 rng(17);
    for (auto& b : garbage) b = static_cast<std::uint8_t>(rng());
    write_gz(file, garbage);
    CHECK_THAT(error_of(read_images), Contains(file.string()) && Contains("bad magic"));
  }
  SECTION("garbage instead of an idx file (not even gzip)") {
    std::ofstream(file, std::ios::binary) << "this is not a gzip'd idx file at all\n";
    CHECK_THAT(error_of(read_images), Contains(file.string()) && Contains("bad magic"));
  }
  SECTION("gzip stream cut in the middle") {
    std::vector<std::uint8_t> bytes = images_file(50, 28, 28, 50 * 28 * 28);
    write_gz(file, bytes);
    std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
    const std::string message = error_of(read_images);
    CHECK_THAT(message, Contains(file.string()));
    CHECK((message.find("truncated") != std::string::npos || message.find("corrupt") != std::string::npos));
  }
  SECTION("labels file where images are expected") {
    write_gz(file, labels_file({1, 2, 3}, 3));
    CHECK_THAT(error_of(read_images), Contains(file.string()) && Contains("bad magic") && Contains("0x00000801"));
  }
  SECTION("more bytes than the header announces") {
    write_gz(file, images_file(1, 28, 28, 2 * 28 * 28));
    CHECK_THAT(error_of(read_images), Contains(file.string()) && Contains("more bytes"));
  }
  SECTION("zero-sized dimension") {
    write_gz(file, images_file(1, 0, 28, 0));
    CHECK_THAT(error_of(read_images), Contains(file.string()) && Contains("at least 1"));
  }
  SECTION("images that are not 28x28") {
    write_gz(file, images_file(2, 27, 28, 2 * 27 * 28));
    write_gz(labels, labels_file({1, 2}, 2));
    CHECK_THAT(error_of([&] { fashion_mnist::load_split<float>(file, labels); }),
               Contains(file.string()) && Contains("28x28"));
  }
  SECTION("label count differs from image count") {
    write_gz(file, images_file(2, 28, 28, 2 * 28 * 28));
    write_gz(labels, labels_file({1, 2, 3}, 3));
    CHECK_THAT(error_of([&] { fashion_mnist::load_split<float>(file, labels); }),
               Contains(labels.string()) && Contains("3 labels") && Contains("2 images"));
  }
  SECTION("label outside 0..9") {
    write_gz(file, images_file(2, 28, 28, 2 * 28 * 28));
    write_gz(labels, labels_file({1, 12}, 2));
    CHECK_THAT(error_of([&] { fashion_mnist::load_split<float>(file, labels); }),
               Contains(labels.string()) && Contains("0..9"));
  }
}
