// Reads the gzip'd idx files of (Fashion-)MNIST with zlib and turns them into Eigen matrices.
//
// The idx format: a big-endian header (magic 0x00000801 for labels, 0x00000803 for
// images, then one 32-bit extent per dimension) followed by the unsigned bytes. Every
// check names the file and what is wrong with it, so a bad download is obvious.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "eigen.hpp"

namespace fashion_mnist {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

inline constexpr std::uint32_t idx_labels_magic = 0x00000801;  // unsigned byte, 1 dimension
inline constexpr std::uint32_t idx_images_magic = 0x00000803;  // unsigned byte, 3 dimensions

// idx contents as stored: one byte per pixel / label.
struct idx_images {
  std::size_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols, image after image, row-major
};
struct idx_labels {
  std::vector<std::uint8_t> labels;
};

namespace detail {

inline std::string missing_file_message(const std::filesystem::path& file) {
  return "Fashion-MNIST file not found: " + file.string() +
         ". Install the data set with `apt-get install dataset-fashion-mnist` (it goes to " + default_data_dir +
         ") or pass --data DIR naming a directory that holds train-images-idx3-ubyte.gz, "
         "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz";
}

// An open gzip stream that reports every short read as an error naming the file.
class gz_reader {
 public:
  explicit gz_reader(const std::filesystem::path& file) : path_(file.string()) {
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) throw std::runtime_error(missing_file_message(file));
    if (std::filesystem::is_directory(file, ec))
      throw std::runtime_error(path_ + ": is a directory, expected a gzip'd idx file");
    errno = 0;
    file_.reset(gzopen(path_.c_str(), "rb"));
    if (!file_)
      throw std::runtime_error(path_ + ": cannot open: " + (errno ? std::strerror(errno) : "out of memory"));
  }

  const std::string& path() const noexcept { return path_; }

  // Reads exactly bytes.size() bytes; `what` names the part of the file for the message.
  void read_exact(std::span<std::uint8_t> bytes, const char* what) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(bytes.size() - done, INT_MAX / 2));
      const int got = gzread(file_.get(), bytes.data() + done, chunk);
      if (got < 0) throw std::runtime_error(path_ + ": corrupt gzip data while reading the " + what + ": " + zlib_error());
      if (got == 0) {
        // gzread reports a cut-off gzip stream as end of file plus a Z_BUF_ERROR.
        int code = Z_OK;
        const char* message = gzerror(file_.get(), &code);
        throw std::runtime_error(path_ + ": truncated: the " + what + " needs " + std::to_string(bytes.size()) +
                                 " bytes but the file ends after " + std::to_string(done) +
                                 (code != Z_OK && message && *message ? std::string(" (zlib: ") + message + ")" : ""));
      }
      done += static_cast<std::size_t>(got);
    }
  }

  std::uint32_t read_be32(const char* what) {
    std::uint8_t b[4];
    read_exact(b, what);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
  }

  // After the payload the stream must end: trailing bytes mean the header lied.
  void expect_end() {
    std::uint8_t extra;
    const int got = gzread(file_.get(), &extra, 1);
    if (got < 0) throw std::runtime_error(path_ + ": corrupt gzip data after the payload: " + zlib_error());
    if (got > 0)
      throw std::runtime_error(path_ + ": has more bytes than its header announces (wrong dimensions in the header?)");
  }

 private:
  std::string zlib_error() {
    int code = Z_OK;
    const char* message = gzerror(file_.get(), &code);
    return message && *message ? message : "unknown zlib error";
  }
  struct closer {
    void operator()(gzFile f) const noexcept { gzclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::remove_pointer_t<gzFile>, closer> file_;
};

inline std::string hex(std::uint32_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) s += digits[(v >> shift) & 0xf];
  return s;
}

inline void check_magic(const gz_reader& in, std::uint32_t magic, std::uint32_t expected, const char* kind) {
  if (magic != expected)
    throw std::runtime_error(in.path() + ": bad magic number " + hex(magic) + ", expected " + hex(expected) + " (" +
                             kind + "); not an idx file, or the wrong file");
}

// Largest idx file we accept: protects against a garbage header asking for terabytes.
inline constexpr std::uint64_t max_idx_bytes = std::uint64_t{1} << 32;

}  // namespace detail

inline idx_images read_idx_images(const std::filesystem::path& file) {
  detail::gz_reader in(file);
  detail::check_magic(in, in.read_be32("header"), idx_images_magic, "idx3 unsigned-byte images");
  idx_images out;
  out.count = in.read_be32("header");
  out.rows = in.read_be32("header");
  out.cols = in.read_be32("header");
  if (out.count == 0 || out.rows == 0 || out.cols == 0)
    throw std::runtime_error(in.path() + ": header announces " + std::to_string(out.count) + " images of " +
                             std::to_string(out.rows) + "x" + std::to_string(out.cols) +
                             " pixels; every dimension must be at least 1");
  const std::uint64_t bytes = std::uint64_t{out.count} * out.rows * out.cols;
  if (bytes > detail::max_idx_bytes)
    throw std::runtime_error(in.path() + ": header announces " + std::to_string(bytes) +
                             " bytes of pixels, more than any idx image file should hold (garbage header?)");
  out.pixels.resize(static_cast<std::size_t>(bytes));
  in.read_exact(out.pixels, "pixel data");
  in.expect_end();
  return out;
}

inline idx_labels read_idx_labels(const std::filesystem::path& file) {
  detail::gz_reader in(file);
  detail::check_magic(in, in.read_be32("header"), idx_labels_magic, "idx1 unsigned-byte labels");
  const std::uint32_t count = in.read_be32("header");
  if (count == 0) throw std::runtime_error(in.path() + ": header announces 0 labels");
  idx_labels out;
  out.labels.resize(count);
  in.read_exact(out.labels, "label data");
  in.expect_end();
  return out;
}

// One split as the model consumes it: a column per sample (Eigen's column-major
// storage makes a run of samples one contiguous block).
template <class T>
struct dataset {
  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> images;  // features x samples
  std::vector<int> labels;
  std::size_t size() const noexcept { return labels.size(); }
};

template <class T>
struct fashion_mnist_data {
  dataset<T> train, test;
};

inline constexpr std::size_t image_side = 28;
inline constexpr int class_count = 10;

// Reads one split (images + labels), checks that they agree and fit Fashion-MNIST,
// and scales the pixels to [0, 1].
template <class T>
dataset<T> load_split(const std::filesystem::path& images_file, const std::filesystem::path& labels_file) {
  const idx_images images = read_idx_images(images_file);
  const idx_labels labels = read_idx_labels(labels_file);
  if (images.rows != image_side || images.cols != image_side)
    throw std::runtime_error(images_file.string() + ": images are " + std::to_string(images.rows) + "x" +
                             std::to_string(images.cols) + " pixels; Fashion-MNIST images are 28x28");
  if (labels.labels.size() != images.count)
    throw std::runtime_error(labels_file.string() + ": holds " + std::to_string(labels.labels.size()) +
                             " labels but " + images_file.string() + " holds " + std::to_string(images.count) +
                             " images; the two files must belong together");
  dataset<T> out;
  out.labels.resize(images.count);
  for (std::size_t i = 0; i < images.count; ++i) {
    const int label = labels.labels[i];
    if (label >= class_count)
      throw std::runtime_error(labels_file.string() + ": label " + std::to_string(i) + " is " + std::to_string(label) +
                               "; Fashion-MNIST labels are 0..9");
    out.labels[i] = label;
  }
  const auto features = static_cast<Eigen::Index>(image_side * image_side);
  const auto count = static_cast<Eigen::Index>(images.count);
  const Eigen::Map<const Eigen::Matrix<std::uint8_t, Eigen::Dynamic, Eigen::Dynamic>> bytes(images.pixels.data(),
                                                                                            features, count);
  out.images = bytes.template cast<T>() * T(1.0 / 255.0);
  return out;
}

// Loads the four files from `dir`. With `standardise`, pixels are shifted and scaled by
// the training set's mean and standard deviation (one scalar each, applied to both splits).
template <class T>
fashion_mnist_data<T> load_fashion_mnist(const std::filesystem::path& dir = default_data_dir,
                                         bool standardise = false) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw std::runtime_error("Fashion-MNIST directory not found: " + dir.string() +
                             ". Install the data set with `apt-get install dataset-fashion-mnist` (it goes to " +
                             default_data_dir + ") or pass --data DIR naming the directory that holds the *-idx*-ubyte.gz files");
  fashion_mnist_data<T> data;
  data.train = load_split<T>(dir / "train-images-idx3-ubyte.gz", dir / "train-labels-idx1-ubyte.gz");
  data.test = load_split<T>(dir / "t10k-images-idx3-ubyte.gz", dir / "t10k-labels-idx1-ubyte.gz");
  if (standardise) {
    // Statistics in double: a float sum over 47M pixels would lose digits.
    const auto& x = data.train.images;
    const double mean = x.template cast<double>().mean();
    const double var = (x.template cast<double>().array() - mean).square().mean();
    const double inv_std = 1.0 / std::sqrt(var > 0 ? var : 1.0);
    for (auto* split : {&data.train, &data.test})
      split->images = ((split->images.array() - T(mean)) * T(inv_std)).matrix();
  }
  return data;
}

}  // namespace fashion_mnist
