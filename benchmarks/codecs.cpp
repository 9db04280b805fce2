// What each gradient codec (gradwire/compress/) costs one rank in compute: encode of its own buffer and decode of
// one payload, per element, beside a plain copy of the buffer (the memory bound).
//   codecs [-n elements] [-r runs] [-o out.csv]
// Prints codec | payload bytes | ratio | encode | decode | ns per element (medians of r
// runs, interleaved) and writes the same as CSV. PowerSGD is timed through its three
// low-rank calls on one rank (the all-reduces between them are the transport's), per unit
// of rank. The ns per element feed gradwire/plan/codec_model.hpp. Never pass/fail.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gradwire/compress/codecs.hpp>

#include "bench_table.hpp"  // median

namespace gw = gradwire;
using clock_type = std::chrono::steady_clock;
using gradwire::bench::median;

namespace {
template <class F>
double seconds(F&& f) {
  const auto t0 = clock_type::now();
  f();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// One codec's timed calls on a buffer of the benchmark's size; prepared once (buffers
// touched), then each run times encode then decode.
struct timed_codec {
  std::string name;
  std::size_t payload_bytes = 0;
  double per_rank_unit = 1;  // PowerSGD: its rank, to report per unit of rank
  std::function<void()> encode, decode;
  std::vector<double> encode_s, decode_s;
};

template <class Codec>
timed_codec make(const std::string& name, Codec codec, std::span<const float> in, std::span<float> out) {
  auto state = std::make_shared<typename Codec::template state<float>>(codec.template init<float>(in.size()));
  auto payload = std::make_shared<std::vector<std::byte>>(codec.template encoded_bytes<float>(in.size()));
  timed_codec t{name, payload->size(), 1, {}, {}, {}, {}};
  t.encode = [codec, state, payload, in] { codec.encode(*state, in, std::span<std::byte>(*payload)); };
  t.decode = [codec, payload, out] { codec.decode(std::span<const std::byte>(*payload), out); };
  t.encode();  // first touch, and the state's first step
  return t;
}

timed_codec make_powersgd(int rank, std::span<const float> in, std::span<float> out) {
  const gw::compress::powersgd codec({.rank = rank, .start_step = 0});
  auto state = std::make_shared<gw::compress::powersgd::state<float>>(codec.init<float>(in.size()));
  timed_codec t{"powersgd:" + std::to_string(rank), codec.encoded_bytes<float>(in.size()), double(rank), {}, {}, {}, {}};
  // One rank's share of a round: the two factors (their all-reduces are the transport's) and
  // the approximation; timed together as "encode", nothing as "decode".
  t.encode = [codec, state, in, out] {
    (void)codec.low_rank_begin(*state, in);
    (void)codec.low_rank_middle(*state);
    codec.low_rank_end(*state, out);
  };
  t.decode = [] {};
  t.encode();
  return t;
}
}  // namespace

int main(int argc, char** argv) {
  std::size_t n = std::size_t{1} << 20;
  int runs = 21;
  std::string csv = "codecs.csv";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "-n") n = std::stoull(value);
    else if (flag == "-r") runs = std::stoi(value);
    else if (flag == "-o") csv = value;
    else {
      std::fprintf(stderr, "codecs: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::vector<float> in(n), out(n), copy(n);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  for (auto& v : in) v = normal(gen);
  namespace c = gw::compress;
  std::vector<timed_codec> codecs;
  codecs.push_back({"copy", n * sizeof(float), 1, [&] { std::memcpy(copy.data(), in.data(), n * sizeof(float)); },
                    [&] { std::memcpy(out.data(), copy.data(), n * sizeof(float)); }, {}, {}});
  codecs.push_back(make("fp16", c::fp16{}, in, out));
  codecs.push_back(make("bf16", c::bf16{}, in, out));
  codecs.push_back(make("int8", c::int8{}, in, out));
  codecs.push_back(make("topk:0.01", c::error_feedback<c::top_k>(c::top_k(0.01)), in, out));
  codecs.push_back(make("fp16+ef", c::error_feedback<c::fp16>(c::fp16{}), in, out));
  codecs.push_back(make_powersgd(4, in, out));
  for (int r = 0; r < runs; ++r)  // interleaved: the machine is noisy
    for (auto& t : codecs) {
      t.encode_s.push_back(seconds(t.encode));
      t.decode_s.push_back(seconds(t.decode));
    }
  std::FILE* f = std::fopen(csv.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "codecs: cannot write %s\n", csv.c_str());
    return 1;
  }
  std::fprintf(f, "codec,elements,payload_bytes,ratio,encode_us,decode_us,ns_per_element,ns_per_element_per_rank_unit\n");
  std::printf("# f32, %zu elements, one rank, medians of %d interleaved runs\n", n, runs);
  std::printf("%-12s %14s %8s %12s %12s %12s %14s\n", "codec", "payload(B)", "ratio", "encode(us)", "decode(us)",
              "ns/element", "ns/elem/unit");
  for (auto& t : codecs) {
    const double enc = median(t.encode_s), dec = median(t.decode_s), per = (enc + dec) / double(n) * 1e9;
    const double ratio = double(n * sizeof(float)) / double(t.payload_bytes);
    std::printf("%-12s %14zu %8.1f %12.1f %12.1f %12.3f %14.3f\n", t.name.c_str(), t.payload_bytes, ratio, enc * 1e6,
                dec * 1e6, per, per / t.per_rank_unit);
    std::fprintf(f, "%s,%zu,%zu,%.3f,%.3f,%.3f,%.4f,%.4f\n", t.name.c_str(), n, t.payload_bytes, ratio, enc * 1e6,
                 dec * 1e6, per, per / t.per_rank_unit);
  }
  std::fclose(f);
  return 0;
}
