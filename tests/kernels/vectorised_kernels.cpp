// Instantiates every host kernel loop and the codecs' loops; tests/kernels/expect_vectorised.cmake
// compiles this with -fopt-info-vec and checks that GCC vectorised each loop marked GRADWIRE_VECTORIZE.
#include <gradwire/compress/codecs.hpp>
#include <gradwire/kernels/host.hpp>
namespace k = gradwire::kernels;
// The kernels run inside collectives and optimizer steps that promise not to throw mid-update.
static_assert(noexcept(k::add<float>(nullptr, nullptr, 0)) && noexcept(k::scale<float>(nullptr, 1.0f, 0)));
template void k::add<float>(float*, const float*, std::size_t);
template void k::add<float>(float*, const float*, const float*, std::size_t);
template void k::scale<float>(float*, float, std::size_t);
template void k::axpy<float>(float, const float*, float*, std::size_t);
template void k::sgd_step<float>(float*, const float*, std::size_t, float, float, float);
template void k::momentum_step<float, true>(float*, const float*, float*, std::size_t, float, float, float, float);
template void k::momentum_step<float, false>(float*, const float*, float*, std::size_t, float, float, float, float);
template void k::adam_step<float>(float*, const float*, float*, float*, std::size_t, const k::adam_coefficients<float>&);
template void k::adam_step<double>(double*, const double*, double*, double*, std::size_t, const k::adam_coefficients<double>&);
template bool k::any_non_finite<float>(const float*, std::size_t);
template bool k::any_non_finite<double>(const double*, std::size_t);

// The codecs' loops, through their public calls on float (the gradients' type).
namespace c = gradwire::compress;
template void c::fp16::encode<float>(std::span<const float>, std::span<std::byte>) const;
template void c::fp16::decode<float>(std::span<const std::byte>, std::span<float>) const;
template void c::fp16::decode_add<float>(std::span<const std::byte>, std::span<float>) const;
template void c::int8::encode<float>(std::span<const float>, std::span<std::byte>) const;
template void c::int8::decode<float>(std::span<const std::byte>, std::span<float>) const;
template void c::int8::decode_add<float>(std::span<const std::byte>, std::span<float>) const;
template void c::error_feedback<c::top_k>::encode<float>(state<float>&, std::span<const float>, std::span<std::byte>) const;
template void c::powersgd::encode<float>(state<float>&, std::span<const float>, std::span<std::byte>) const;
template void c::powersgd::decode_add<float>(std::span<const std::byte>, std::span<float>) const;
template std::span<float> c::powersgd::low_rank_middle<float>(state<float>&) const;
template void c::powersgd::low_rank_end<float>(state<float>&, std::span<float>) const;
