#include "textgen/router/metrics.h"

#include <cmath>
#include <sstream>

#include "textgen/base/check.h"

namespace textgen::router {
namespace {

std::string escapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string formatLabels(const Labels& labels, const std::string& extraKey = {},
                         const std::string& extraValue = {}) {
  if (labels.empty() && extraKey.empty()) return {};
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    out += (first ? "" : ",") + k + "=\"" + escapeLabel(v) + "\"";
    first = false;
  }
  if (!extraKey.empty()) out += (first ? "" : ",") + extraKey + "=\"" + extraValue + "\"";
  return out + "}";
}

std::string formatValue(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

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

}  // namespace

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

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, Type type) {
  Family& f = families_[name];
  if (!f.typed) {
    f.type = type;
    f.typed = true;
    if (type == Type::kHistogram && f.buckets.empty()) f.buckets = defaultBuckets();
  }
  TG_CHECK(f.type == type, "metric {} used with two types", name);
  return f;
}

void MetricsRegistry::describe(const std::string& name, const std::string& help,
                               std::vector<double> buckets) {
  std::lock_guard lock(mutex_);
  Family& f = families_[name];
  f.help = help;
  if (!buckets.empty()) f.buckets = std::move(buckets);
}

void MetricsRegistry::counterAdd(const std::string& name, double v, const Labels& labels) {
  std::lock_guard lock(mutex_);
  family(name, Type::kCounter).series[labels].value += v;
}

void MetricsRegistry::gaugeSet(const std::string& name, double v, const Labels& labels) {
  std::lock_guard lock(mutex_);
  family(name, Type::kGauge).series[labels].value = v;
}

void MetricsRegistry::histogramObserve(const std::string& name, double v, const Labels& labels) {
  std::lock_guard lock(mutex_);
  Family& f = family(name, Type::kHistogram);
  Series& s = f.series[labels];
  if (s.bucketCounts.empty()) s.bucketCounts.assign(f.buckets.size(), 0);
  for (size_t i = 0; i < f.buckets.size(); ++i) {
    if (v <= f.buckets[i]) {
      ++s.bucketCounts[i];
      break;  // cumulated at render time
    }
  }
  s.sum += v;
  ++s.count;
}

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mutex_);
  std::ostringstream out;
  for (const auto& [name, f] : families_) {
    if (!f.typed) continue;  // described but never used
    out << "# HELP " << name << " " << escapeHelp(f.help) << "\n";
    out << "# TYPE " << name << " "
        << (f.type == Type::kCounter ? "counter"
            : f.type == Type::kGauge ? "gauge"
                                     : "histogram")
        << "\n";
    for (const auto& [labels, s] : f.series) {
      if (f.type != Type::kHistogram) {
        out << name << formatLabels(labels) << " " << formatValue(s.value) << "\n";
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < f.buckets.size(); ++i) {
        cumulative += i < s.bucketCounts.size() ? s.bucketCounts[i] : 0;
        out << name << "_bucket" << formatLabels(labels, "le", formatValue(f.buckets[i])) << " "
            << cumulative << "\n";
      }
      out << name << "_bucket" << formatLabels(labels, "le", "+Inf") << " " << s.count << "\n";
      out << name << "_sum" << formatLabels(labels) << " " << formatValue(s.sum) << "\n";
      out << name << "_count" << formatLabels(labels) << " " << s.count << "\n";
    }
  }
  return out.str();
}

}  // namespace textgen::router
