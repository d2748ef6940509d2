#include "textgen/router/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <mutex>
#include <sstream>

#include "textgen/base/check.h"

namespace textgen::router {
namespace {

// prometheus-cpp writes help text as given; the exposition format wants \ and newlines escaped.
std::string escapeHelp(const std::string& h) {
  std::string out;
  for (char c : h) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

enum class Type { kCounter, kGauge, kHistogram };

}  // namespace

// Families are created on first use; help text is applied at render time (a metric may be
// described after its first use: the router learns some limits from its first replica), buckets
// when a series is created. Each family's series are kept by label set: prometheus-cpp's
// Family::Add constructs a metric on every call (a histogram's buckets included) before it finds
// an existing one.
struct MetricsRegistry::Impl {
  struct Description {
    std::string help;
    std::vector<double> buckets;
  };
  struct Family {
    Type type = Type::kCounter;
    prometheus::Family<prometheus::Counter>* counters = nullptr;
    prometheus::Family<prometheus::Gauge>* gauges = nullptr;
    prometheus::Family<prometheus::Histogram>* histograms = nullptr;
    std::map<Labels, prometheus::Counter*> counter;
    std::map<Labels, prometheus::Gauge*> gauge;
    std::map<Labels, prometheus::Histogram*> histogram;
  };

  Family& family(const std::string& name, Type type) {
    auto it = families.find(name);
    if (it != families.end()) {
      TG_CHECK(it->second.type == type, "metric {} used with two types", name);
      return it->second;
    }
    Family f;
    f.type = type;
    switch (type) {
      case Type::kCounter:
        f.counters = &prometheus::BuildCounter().Name(name).Register(registry);
        break;
      case Type::kGauge: f.gauges = &prometheus::BuildGauge().Name(name).Register(registry); break;
      case Type::kHistogram:
        f.histograms = &prometheus::BuildHistogram().Name(name).Register(registry);
        break;
    }
    return families.emplace(name, std::move(f)).first->second;
  }

  std::vector<double> buckets(const std::string& name) const {
    auto d = described.find(name);
    return d == described.end() || d->second.buckets.empty() ? defaultBuckets() : d->second.buckets;
  }

  std::mutex mutex;
  prometheus::Registry registry;
  std::map<std::string, Description> described;
  std::map<std::string, Family> families;
};

MetricsRegistry::MetricsRegistry() : impl_(std::make_unique<Impl>()) {}
MetricsRegistry::~MetricsRegistry() = default;

std::vector<double> MetricsRegistry::defaultBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

std::vector<double> tgiDurationBuckets() {
  std::vector<double> b;
  double v = 0.0001;
  for (int i = 0; i < 35; ++i) {
    v *= 1.5;
    b.push_back(v);
  }
  return b;
}

std::vector<double> tgiLinearBuckets(double max, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i) b.push_back(max / count * (i + 1));
  return b;
}

void MetricsRegistry::describe(const std::string& name, const std::string& help,
                               std::vector<double> buckets) {
  std::lock_guard lock(impl_->mutex);
  impl_->described[name] = {.help = help, .buckets = std::move(buckets)};
}

void MetricsRegistry::counterAdd(const std::string& name, double v, const Labels& labels) {
  std::lock_guard lock(impl_->mutex);
  Impl::Family& f = impl_->family(name, Type::kCounter);
  prometheus::Counter*& c = f.counter[labels];
  if (!c) c = &f.counters->Add(labels);
  c->Increment(v);
}

void MetricsRegistry::gaugeSet(const std::string& name, double v, const Labels& labels) {
  std::lock_guard lock(impl_->mutex);
  Impl::Family& f = impl_->family(name, Type::kGauge);
  prometheus::Gauge*& g = f.gauge[labels];
  if (!g) g = &f.gauges->Add(labels);
  g->Set(v);
}

void MetricsRegistry::histogramObserve(const std::string& name, double v, const Labels& labels) {
  std::lock_guard lock(impl_->mutex);
  Impl::Family& f = impl_->family(name, Type::kHistogram);
  prometheus::Histogram*& h = f.histogram[labels];
  if (!h) h = &f.histograms->Add(labels, impl_->buckets(name));
  h->Observe(v);
}

std::string MetricsRegistry::render() const {
  std::vector<prometheus::MetricFamily> families = impl_->registry.Collect();
  {
    std::lock_guard lock(impl_->mutex);
    for (prometheus::MetricFamily& f : families) {
      auto d = impl_->described.find(f.name);
      if (d != impl_->described.end()) f.help = escapeHelp(d->second.help);
    }
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace textgen::router
