/*
 * Runs Kafka's own server-side assignors (kafka-group-coordinator) on inputs written by
 * tests/benchmarks/workload.py, for `dev/bench engine`.
 *
 * Usage: java -cp <kafka jars>:<classes> AssignorBench WARMUP_MS MIN_WARMUP RUNS CASE...
 *   CASE = <assignor name>=<input file>   (assignor name: uniform or range)
 *
 * For every case it prints one JSON object per line:
 *   {"assignor":..,"file":..,"runs":[ms,...],"digest":..,"moved":..}
 * Only assign() is timed. The GroupSpec (including Kafka's inverted partition -> member index
 * that its coordinator maintains incrementally) is built before timing starts.
 */

import org.apache.kafka.common.Uuid;
import org.apache.kafka.coordinator.group.api.assignor.ConsumerGroupPartitionAssignor;
import org.apache.kafka.coordinator.group.api.assignor.GroupAssignment;
import org.apache.kafka.coordinator.group.api.assignor.MemberAssignment;
import org.apache.kafka.coordinator.group.api.assignor.SubscribedTopicDescriber;
import org.apache.kafka.coordinator.group.api.assignor.SubscriptionType;
import org.apache.kafka.coordinator.group.assignor.RangeAssignor;
import org.apache.kafka.coordinator.group.assignor.UniformAssignor;
import org.apache.kafka.coordinator.group.modern.Assignment;
import org.apache.kafka.coordinator.group.modern.GroupSpecImpl;
import org.apache.kafka.coordinator.group.modern.MemberSubscriptionAndAssignmentImpl;

import java.io.BufferedReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.UUID;

public final class AssignorBench {

    private static final class Input {
        SubscriptionType type;
        Uuid[] topicIds;
        String[] topicNames; // canonical UUID text, as Python prints it
        Map<Uuid, String> topicText = new HashMap<>();
        Map<Uuid, Integer> partitions = new HashMap<>();
        Map<String, MemberSubscriptionAndAssignmentImpl> members = new HashMap<>();
        Map<Uuid, Map<Integer, String>> inverted = new HashMap<>();
    }

    private static Set<Integer> parseRanges(String text) {
        Set<Integer> out = new HashSet<>();
        for (String piece : text.split(",")) {
            int dash = piece.indexOf('-');
            if (dash < 0) {
                out.add(Integer.parseInt(piece));
            } else {
                int lo = Integer.parseInt(piece.substring(0, dash));
                int hi = Integer.parseInt(piece.substring(dash + 1));
                for (int p = lo; p <= hi; p++) out.add(p);
            }
        }
        return out;
    }

    private static Input read(Path file) throws Exception {
        Input in = new Input();
        try (BufferedReader r = Files.newBufferedReader(file, StandardCharsets.UTF_8)) {
            in.type = SubscriptionType.valueOf(r.readLine().split(" ")[1]);
            int topics = Integer.parseInt(r.readLine().split(" ")[1]);
            in.topicIds = new Uuid[topics];
            in.topicNames = new String[topics];
            for (int t = 0; t < topics; t++) {
                String[] f = r.readLine().split(" ");
                UUID u = UUID.fromString(f[0]);
                Uuid id = new Uuid(u.getMostSignificantBits(), u.getLeastSignificantBits());
                in.topicIds[t] = id;
                in.topicNames[t] = f[0];
                in.topicText.put(id, f[0]);
                in.partitions.put(id, Integer.parseInt(f[1]));
            }
            int members = Integer.parseInt(r.readLine().split(" ")[1]);
            for (int m = 0; m < members; m++) {
                String[] f = r.readLine().split(" ");
                String memberId = f[0];
                Optional<String> instance = f[1].equals("-") ? Optional.empty() : Optional.of(f[1]);
                Set<Uuid> subscribed = new HashSet<>();
                if (!f[2].equals("-")) {
                    for (String t : f[2].split(",")) subscribed.add(in.topicIds[Integer.parseInt(t)]);
                }
                Map<Uuid, Set<Integer>> assigned = new HashMap<>();
                if (!f[3].equals("-")) {
                    for (String entry : f[3].split(";")) {
                        int colon = entry.indexOf(':');
                        Uuid t = in.topicIds[Integer.parseInt(entry.substring(0, colon))];
                        Set<Integer> parts = parseRanges(entry.substring(colon + 1));
                        assigned.put(t, parts);
                        Map<Integer, String> owners = in.inverted.computeIfAbsent(t, k -> new HashMap<>());
                        for (int p : parts) owners.put(p, memberId);
                    }
                }
                in.members.put(memberId, new MemberSubscriptionAndAssignmentImpl(
                    Optional.empty(), instance, subscribed, new Assignment(assigned)));
            }
        }
        return in;
    }

    private static String ranges(Set<Integer> parts) {
        int[] sorted = parts.stream().mapToInt(Integer::intValue).sorted().toArray();
        StringBuilder sb = new StringBuilder();
        int i = 0;
        while (i < sorted.length) {
            int j = i;
            while (j + 1 < sorted.length && sorted[j + 1] == sorted[j] + 1) j++;
            if (sb.length() > 0) sb.append(',');
            sb.append(sorted[i]);
            if (j > i) sb.append('-').append(sorted[j]);
            i = j + 1;
        }
        return sb.toString();
    }

    /** Same digest as tests.benchmarks.workload.assignment_digest. */
    private static String digest(Input in, GroupAssignment result) throws Exception {
        List<String> rows = new ArrayList<>();
        for (Map.Entry<String, MemberAssignment> e : result.members().entrySet()) {
            for (Map.Entry<Uuid, Set<Integer>> tp : e.getValue().partitions().entrySet()) {
                if (tp.getValue().isEmpty()) continue;
                rows.add(e.getKey() + " " + in.topicText.get(tp.getKey()) + " " + ranges(tp.getValue()));
            }
        }
        Collections.sort(rows);
        MessageDigest sha = MessageDigest.getInstance("SHA-256");
        for (String row : rows) {
            sha.update(row.getBytes(StandardCharsets.UTF_8));
            sha.update((byte) '\n');
        }
        StringBuilder hex = new StringBuilder();
        for (byte b : sha.digest()) hex.append(String.format("%02x", b));
        return hex.substring(0, 16);
    }

    private static long moved(Input in, GroupAssignment result) {
        long moved = 0;
        for (Map.Entry<String, MemberAssignment> e : result.members().entrySet()) {
            for (Map.Entry<Uuid, Set<Integer>> tp : e.getValue().partitions().entrySet()) {
                Map<Integer, String> owners = in.inverted.getOrDefault(tp.getKey(), Collections.emptyMap());
                for (int p : tp.getValue()) {
                    if (!e.getKey().equals(owners.get(p))) moved++;
                }
            }
        }
        return moved;
    }

    public static void main(String[] args) throws Exception {
        long warmupNanos = Long.parseLong(args[0]) * 1_000_000L;
        int minWarmup = Integer.parseInt(args[1]);
        int runs = Integer.parseInt(args[2]);
        for (int c = 3; c < args.length; c++) {
            String[] kv = args[c].split("=", 2);
            ConsumerGroupPartitionAssignor assignor =
                kv[0].equals("range") ? new RangeAssignor() : new UniformAssignor();
            Input in = read(Path.of(kv[1]));
            GroupSpecImpl spec = new GroupSpecImpl(in.members, in.type, in.inverted);
            SubscribedTopicDescriber topics = new SubscribedTopicDescriber() {
                @Override
                public int numPartitions(Uuid topicId) {
                    Integer n = in.partitions.get(topicId);
                    return n == null ? -1 : n;
                }

                @Override
                public Set<String> racksForPartition(Uuid topicId, int partition) {
                    return Collections.emptySet();
                }
            };
            GroupAssignment result = null;
            long warmStart = System.nanoTime();
            int warmed = 0;
            while (warmed < minWarmup || System.nanoTime() - warmStart < warmupNanos) {
                result = assignor.assign(spec, topics);
                warmed++;
                if (warmed >= 10_000) break;
            }
            double[] times = new double[runs];
            for (int i = 0; i < runs; i++) {
                long t0 = System.nanoTime();
                result = assignor.assign(spec, topics);
                times[i] = (System.nanoTime() - t0) / 1e6;
            }
            StringBuilder json = new StringBuilder();
            json.append("{\"assignor\":\"").append(kv[0]).append("\",\"file\":\"")
                .append(kv[1].replace("\\", "\\\\").replace("\"", "\\\"")).append("\",\"warmup\":")
                .append(warmed).append(",\"runs\":").append(Arrays.toString(times))
                .append(",\"digest\":\"").append(digest(in, result)).append("\",\"moved\":")
                .append(moved(in, result)).append("}");
            System.out.println(json);
            System.out.flush();
        }
    }
}
