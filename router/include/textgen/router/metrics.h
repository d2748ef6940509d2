// The router's Prometheus registry: counters, gauges and histograms with labels, named at the call
// site, on prometheus-cpp's core (src/metrics/metrics.cpp; tools/fetch-prometheus-cpp.sh), rendered
// in the text exposition format. Thread-safe. TGI's metric names, types and bucket layouts are
// declared by the router on top of it, so TGI dashboards work unchanged. prometheus-cpp's headers
// stay inside metrics.cpp.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace textgen::router {

using Labels = std::map<std::string, std::string>;

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  void counterAdd(const std::string& name, double v = 1.0, const Labels& labels = {});
  void gaugeSet(const std::string& name, double v, const Labels& labels = {});
  void histogramObserve(const std::string& name, double v, const Labels& labels = {});

  // Declares a metric's help text and, for histograms, its bucket upper bounds (ascending; they
  // apply to series created afterwards). A metric used without a declaration gets empty help and,
  // as a histogram, the default buckets. A metric is rendered once used.
  void describe(const std::string& name, const std::string& help, std::vector<double> buckets = {});

  // The text exposition format (version 0.0.4).
  std::string render() const;

  // Prometheus client defaults.
  static std::vector<double> defaultBuckets();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// TGI's bucket layouts.
std::vector<double> tgiDurationBuckets();                           // 35 steps ×1.5 from 0.00015 s
std::vector<double> tgiLinearBuckets(double max, int count = 100);  // max/count ... max

}  // namespace textgen::router
