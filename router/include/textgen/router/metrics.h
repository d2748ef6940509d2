// A small Prometheus registry (prometheus-cpp is not in Debian): counters, gauges and histograms
// with labels, rendered in the text exposition format. Thread-safe. TGI's metric names, types and
// bucket layouts are declared by the router on top of it, so TGI dashboards work unchanged.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace textgen::router {

using Labels = std::map<std::string, std::string>;

class MetricsRegistry {
 public:
  void counterAdd(const std::string& name, double v = 1.0, const Labels& labels = {});
  void gaugeSet(const std::string& name, double v, const Labels& labels = {});
  void histogramObserve(const std::string& name, double v, const Labels& labels = {});

  // Declares a metric's help text and, for histograms, its bucket upper bounds (ascending). A
  // metric used without a declaration gets empty help and, as a histogram, the default buckets.
  void describe(const std::string& name, const std::string& help, std::vector<double> buckets = {});

  // The text exposition format (version 0.0.4).
  std::string render() const;

  // Prometheus client defaults.
  static std::vector<double> defaultBuckets();

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    double value = 0;                    // counter / gauge
    std::vector<uint64_t> bucketCounts;  // histogram, cumulative at render time
    double sum = 0;
    uint64_t count = 0;
  };
  struct Family {
    Type type = Type::kCounter;
    bool typed = false;
    std::string help;
    std::vector<double> buckets;
    std::map<Labels, Series> series;
  };
  Family& family(const std::string& name, Type type);

  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
};

// TGI's bucket layouts.
std::vector<double> tgiDurationBuckets();                           // 35 steps ×1.5 from 0.00015 s
std::vector<double> tgiLinearBuckets(double max, int count = 100);  // max/count ... max

}  // namespace textgen::router
