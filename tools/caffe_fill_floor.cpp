// What BVLC Caffe's fillers must compute while it builds a net, timed: caffe_rng_gaussian and
// caffe_rng_uniform (src/caffe/util/math_functions.cpp, Boost.Random on boost::mt19937, seeded
// 1701) into fresh host memory (SyncedMemory::to_cpu: malloc + memset), for every weight blob of
// the train net and again of the test net (Solver::InitTestNets builds it with its own fillers).
// The yardstick of tools/bench_startup.py for AlexNet and VGG-16, where these draws are most of
// Caffe's start-up; the engine draws the same values (tests/test_rng.py compiles Boost's own
// distributions when its headers are there and compares them bit for bit).
//
//   g++ -O2 -o /tmp/caffe_fill_floor tools/caffe_fill_floor.cpp   # needs Boost's headers
//   /tmp/caffe_fill_floor alexnet; /tmp/caffe_fill_floor vgg16
#include <boost/math/special_functions/next.hpp>
#include <boost/random.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

typedef boost::mt19937 rng_t;
static rng_t rng(1701);

static void gaussian(long n, float sigma, float* r) {
  boost::normal_distribution<float> d(0, sigma);
  boost::variate_generator<rng_t*, boost::normal_distribution<float> > g(&rng, d);
  for (long i = 0; i < n; ++i) r[i] = g();
}

static void uniform(long n, float a, float b, float* r) {
  boost::uniform_real<float> d(a, boost::math::nextafter<float>(b, std::numeric_limits<float>::max()));
  boost::variate_generator<rng_t*, boost::uniform_real<float> > g(&rng, d);
  for (long i = 0; i < n; ++i) r[i] = g();
}

struct Weights { long out, in; bool xavier; float std; };

int main(int argc, char** argv) {
  std::string net = argc > 1 ? argv[1] : "alexnet";
  std::vector<Weights> blobs;
  if (net == "alexnet") {
    blobs = {{96, 363, false, .01f}, {256, 1200, false, .01f}, {384, 2304, false, .01f},
             {384, 1728, false, .01f}, {256, 1728, false, .01f}, {4096, 9216, false, .005f},
             {4096, 4096, false, .005f}, {1000, 4096, false, .01f}};
  } else if (net == "vgg16") {   // xavier 3x3 convolutions, gaussian InnerProducts
    int convs[][2] = {{64, 3}, {64, 64}, {128, 64}, {128, 128}, {256, 128}, {256, 256},
                      {256, 256}, {512, 256}, {512, 512}, {512, 512}, {512, 512}, {512, 512},
                      {512, 512}};
    for (auto& c : convs) blobs.push_back({c[0], (long)c[1] * 9, true, 0});
    blobs.push_back({4096, 25088, false, .005f});
    blobs.push_back({4096, 4096, false, .005f});
    blobs.push_back({1000, 4096, false, .005f});
  } else {
    fprintf(stderr, "usage: %s alexnet|vgg16\n", argv[0]);
    return 2;
  }
  double seconds = 0;
  long count = 0;
  float check = 0;
  for (int copy = 0; copy < 2; ++copy) {   // the train net, then the test net
    auto start = std::chrono::steady_clock::now();
    for (auto& b : blobs) {
      long n = b.out * b.in;
      float* p = (float*)malloc(n * sizeof(float));
      memset(p, 0, n * sizeof(float));
      if (b.xavier) {
        float s = std::sqrt(3.0f / b.in);
        uniform(n, -s, s, p);
      } else {
        gaussian(n, b.std, p);
      }
      check += p[n / 3];
      count += n;   // kept, as the nets keep their weights
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  printf("%s: %ld weights drawn (train + test net) in %.3f s (%.2f ns each) [%g]\n", net.c_str(),
         count, seconds, seconds / count * 1e9, check);
  return 0;
}
