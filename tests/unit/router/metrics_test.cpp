#include "textgen/router/metrics.h"

#include <gtest/gtest.h>

namespace textgen::router {
namespace {

TEST(MetricsTest, RendersPrometheusTextFormat) {
  MetricsRegistry m;
  m.describe("tgi_request_count", "Number of requests");
  m.describe("tgi_request_duration", "Request duration", {0.1, 1.0});
  m.counterAdd("tgi_request_count");
  m.counterAdd("tgi_request_count");
  m.counterAdd("tgi_request_failure", 1, {{"err", "validation"}});
  m.gaugeSet("tgi_queue_size", 3);
  m.histogramObserve("tgi_request_duration", 0.05);
  m.histogramObserve("tgi_request_duration", 0.5);
  m.histogramObserve("tgi_request_duration", 5.0);
  const std::string text = m.render();
  EXPECT_NE(text.find("# HELP tgi_request_count Number of requests\n# TYPE tgi_request_count "
                      "counter\ntgi_request_count 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tgi_request_failure{err=\"validation\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n"), std::string::npos);
  EXPECT_NE(text.find("tgi_request_duration_bucket{le=\"0.1\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tgi_request_duration_bucket{le=\"1\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("tgi_request_duration_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("tgi_request_duration_sum 5.55\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tgi_request_duration_count 3\n"), std::string::npos);
}

TEST(MetricsTest, EscapesLabelValuesAndTgiBuckets) {
  MetricsRegistry m;
  m.counterAdd("x_total", 1, {{"err", "a\"b\\c\nd"}});
  EXPECT_NE(m.render().find("x_total{err=\"a\\\"b\\\\c\\nd\"} 1"), std::string::npos) << m.render();
  const auto d = tgiDurationBuckets();
  ASSERT_EQ(d.size(), 35u);
  EXPECT_DOUBLE_EQ(d.front(), 0.00015);
  EXPECT_NEAR(d[1] / d[0], 1.5, 1e-12);
  const auto l = tgiLinearBuckets(1024);
  ASSERT_EQ(l.size(), 100u);
  EXPECT_DOUBLE_EQ(l.back(), 1024.0);
}

TEST(MetricsTest, HelpIsEscapedAndUnusedFamiliesAreNotRendered) {
  MetricsRegistry m;
  m.describe("a_total", "two\nlines \\ back");
  m.describe("b_total", "never used");
  m.counterAdd("a_total", 2);
  m.counterAdd("a_total", 0.5);
  const std::string text = m.render();
  EXPECT_NE(
      text.find("# HELP a_total two\\nlines \\\\ back\n# TYPE a_total counter\na_total 2.5\n"),
      std::string::npos)
      << text;
  EXPECT_EQ(text.find("b_total"), std::string::npos) << text;
}

TEST(MetricsTest, SeriesAreKeptPerLabelSetAndTypesAreFixed) {
  MetricsRegistry m;
  m.describe("h", "", {1, 2});
  for (int i = 0; i < 3; ++i) m.histogramObserve("h", 1.5, {{"k", "a"}});
  m.histogramObserve("h", 3, {{"k", "b"}});
  m.gaugeSet("g", 1);
  m.gaugeSet("g", -4);
  const std::string text = m.render();
  EXPECT_NE(text.find("h_bucket{k=\"a\",le=\"2\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_bucket{k=\"b\",le=\"2\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_count{k=\"b\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ng -4\n"), std::string::npos) << text;
  m.describe("g", "described late");
  EXPECT_NE(m.render().find("# HELP g described late\n# TYPE g gauge\n"), std::string::npos);
  EXPECT_DEATH(m.counterAdd("g"), "two types");
}

}  // namespace
}  // namespace textgen::router
