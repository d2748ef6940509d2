// planGroupRestarts: which replicas' pods the operator deletes together. A restarted container, a
// failed pod or a pod being deleted takes its whole replica down (and only it); outdated pods are
// replaced a whole replica at a time, at once when the replica is down anyway, else only while
// every replica serves.
#include "textgen/operator/group_restart.h"

#include <gtest/gtest.h>

#include "textgen/operator/desired_objects.h"

namespace textgen::op {
namespace {

ServiceSpec spec(int64_t shards, int64_t shardsPerPod, int64_t replicas) {
  ServiceSpec s;
  s.name = "llama";
  s.ns = "ml";
  s.shards = shards;
  s.shardsPerPod = shardsPerPod;
  s.replicas = replicas;
  return s;
}

json pod(const std::string& name, const std::string& revision = "rev-1", bool ready = true,
         int restarts = 0) {
  return {{"metadata", {{"name", name}, {"labels", {{kRevisionLabel, revision}}}}},
          {"status",
           {{"phase", "Running"},
            {"conditions", {{{"type", "Ready"}, {"status", ready ? "True" : "False"}}}},
            {"containerStatuses", {{{"name", "shard"}, {"restartCount", restarts}}}}}}};
}

// Replica r of `s` with every pod present and ready at rev-1, its StatefulSet at `revision`.
ReplicaPods replica(const ServiceSpec& s, int64_t r, const std::string& revision = "rev-1") {
  ReplicaPods out;
  out.statefulSet = {{"status", {{"updateRevision", revision}}}};
  for (int64_t p = 0; p < podsPerReplica(s); ++p)
    out.pods.push_back(pod(shardStatefulSetName(s, r) + "-" + std::to_string(p)));
  return out;
}

TEST(GroupRestartTest, ServingReplicasAreLeftAlone) {
  const ServiceSpec s = spec(4, 2, 2);
  const GroupPlan plan = planGroupRestarts(s, {replica(s, 0), replica(s, 1)});
  EXPECT_TRUE(plan.restarts.empty());
  EXPECT_EQ(plan.serving, (std::vector<int64_t>{0, 1}));
}

TEST(GroupRestartTest, ARestartedRankTakesItsWholeReplicaDown) {
  const ServiceSpec s = spec(4, 2, 2);
  std::vector<ReplicaPods> replicas = {replica(s, 0), replica(s, 1)};
  replicas[0].pods[1] = pod("llama-shard-0-1", "rev-1", true, 1);
  const GroupPlan plan = planGroupRestarts(s, replicas);
  ASSERT_EQ(plan.restarts.size(), 1u);
  const GroupRestart& g = plan.restarts[0];
  EXPECT_EQ(g.replica, 0);
  EXPECT_EQ(g.cause, GroupRestart::Cause::kRankFailed);
  EXPECT_EQ(g.pods, (std::vector<std::string>{"llama-shard-0-0", "llama-shard-0-1"}));
  EXPECT_EQ(g.reason, "container shard of pod llama-shard-0-1 restarted (1x)");
  EXPECT_EQ(plan.serving, (std::vector<int64_t>{1}));
}

// One pod per replica (the default): the pod is the group; a container's restart recreates it.
TEST(GroupRestartTest, OnePodReplicaIsRecreatedWhenOneOfItsRanksRestarts) {
  const ServiceSpec s = spec(2, 2, 1);
  ReplicaPods r = replica(s, 0);
  r.pods[0] = pod("llama-shard-0-0", "rev-1", false, 3);
  const GroupPlan plan = planGroupRestarts(s, {r});
  ASSERT_EQ(plan.restarts.size(), 1u);
  EXPECT_EQ(plan.restarts[0].pods, (std::vector<std::string>{"llama-shard-0-0"}));
}

TEST(GroupRestartTest, AFailedOrDeletedPodTakesTheOthersWithIt) {
  const ServiceSpec s = spec(3, 1, 2);
  std::vector<ReplicaPods> replicas = {replica(s, 0), replica(s, 1)};
  replicas[0].pods[2]["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z";
  replicas[1].pods[0]["status"]["phase"] = "Failed";
  const GroupPlan plan = planGroupRestarts(s, replicas);
  ASSERT_EQ(plan.restarts.size(), 2u);
  EXPECT_EQ(plan.restarts[0].reason, "pod llama-shard-0-2 is being deleted");
  EXPECT_EQ(plan.restarts[0].pods,
            (std::vector<std::string>{"llama-shard-0-0", "llama-shard-0-1"}));
  EXPECT_EQ(plan.restarts[1].reason, "pod llama-shard-1-0 failed");
  EXPECT_EQ(plan.restarts[1].pods.size(), 3u);
  // Once every pod of the replica is terminating, there is nothing left to delete.
  for (json& p : replicas[0].pods) p["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z";
  replicas[1] = replica(s, 1);
  EXPECT_TRUE(planGroupRestarts(s, replicas).restarts.empty());
}

TEST(GroupRestartTest, UpdatesTakeOneServingReplicaDownAtATime) {
  const ServiceSpec s = spec(2, 1, 3);
  std::vector<ReplicaPods> replicas = {replica(s, 0, "rev-2"), replica(s, 1, "rev-2"),
                                       replica(s, 2, "rev-2")};
  GroupPlan plan = planGroupRestarts(s, replicas);
  ASSERT_EQ(plan.restarts.size(), 1u);
  EXPECT_EQ(plan.restarts[0].replica, 0);
  EXPECT_EQ(plan.restarts[0].cause, GroupRestart::Cause::kOutdated);
  EXPECT_EQ(plan.restarts[0].pods,
            (std::vector<std::string>{"llama-shard-0-0", "llama-shard-0-1"}));
  // Replica 0 is being recreated at rev-2 (not ready yet): the others wait for it.
  replicas[0].pods = {pod("llama-shard-0-0", "rev-2", false), pod("llama-shard-0-1", "rev-2")};
  EXPECT_TRUE(planGroupRestarts(s, replicas).restarts.empty());
  // Replica 0 serves again: replica 1 goes next.
  replicas[0].pods[0] = pod("llama-shard-0-0", "rev-2");
  plan = planGroupRestarts(s, replicas);
  ASSERT_EQ(plan.restarts.size(), 1u);
  EXPECT_EQ(plan.restarts[0].replica, 1);
}

TEST(GroupRestartTest, AnOutdatedReplicaThatIsDownIsUpdatedAtOnce) {
  const ServiceSpec s = spec(2, 1, 2);
  std::vector<ReplicaPods> replicas = {replica(s, 0, "rev-2"), replica(s, 1, "rev-2")};
  replicas[1].pods[1] = pod("llama-shard-1-1", "rev-1", false);  // loading, say
  const GroupPlan plan = planGroupRestarts(s, replicas);
  ASSERT_EQ(plan.restarts.size(), 1u);
  EXPECT_EQ(plan.restarts[0].replica, 1);
  EXPECT_EQ(plan.restarts[0].cause, GroupRestart::Cause::kOutdated);
  // A StatefulSet whose controller has not reported a revision yet: nothing to compare.
  replicas[0].statefulSet = nullptr;
  replicas[1].statefulSet = nullptr;
  EXPECT_TRUE(planGroupRestarts(s, replicas).restarts.empty());
}

TEST(GroupRestartTest, MissingPodsAreNotAFailure) {
  const ServiceSpec s = spec(2, 1, 1);
  ReplicaPods r = replica(s, 0);
  r.pods.pop_back();  // not created yet
  const GroupPlan plan = planGroupRestarts(s, {r});
  EXPECT_TRUE(plan.restarts.empty());
  EXPECT_TRUE(plan.serving.empty());
}

}  // namespace
}  // namespace textgen::op
