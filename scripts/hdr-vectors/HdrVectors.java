// Prints percentiles that HdrHistogram's Java implementation computes for a few data sets,
// in the form crates/ingressbench-stats/tests/data/hdr-java-percentiles.txt holds them.
// The data sets come from one 64-bit LCG, so the Rust test regenerates the same values.
//
//   bash scripts/hdr-vectors/generate.sh > crates/ingressbench-stats/tests/data/hdr-java-percentiles.txt
import org.HdrHistogram.Histogram;

public class HdrVectors {
    public static void main(String[] args) {
        long[][] sets = { {1000, 1}, {2000, 2}, {10000, 3}, {12345, 4}, {100000, 5}, {999, 6}, {3, 7} };
        double[] ps = { 0.0, 50.0, 75.0, 90.0, 99.0, 99.9, 99.99, 99.999, 100.0 };
        Histogram probe = new Histogram(1, 3_600_000_000L, 3);
        probe.recordValue(1);
        java.io.ByteArrayOutputStream text = new java.io.ByteArrayOutputStream();
        probe.outputPercentileDistribution(new java.io.PrintStream(text), 1000.0);
        String footer = "";
        for (String line : text.toString().split("\n")) {
            if (line.startsWith("#[Buckets")) footer = line;
        }
        System.out.println("# HdrHistogram (Java): Histogram(1, 3600000000, 3); its .hgrm footer: " + footer);
        System.out.println("# count seed percentile value");
        for (long[] set : sets) {
            Histogram h = new Histogram(1, 3_600_000_000L, 3);
            long x = set[1];
            for (long i = 0; i < set[0]; i++) {
                x = x * 6364136223846793005L + 1442695040888963407L;
                // 1 us to about 100 ms, skewed towards small values as latencies are.
                long v = 1 + ((x >>> 33) % 1000) * ((x >>> 20) % 100 + 1);
                h.recordValue(v);
            }
            for (double p : ps) {
                System.out.println(set[0] + " " + set[1] + " " + p + " " + h.getValueAtPercentile(p));
            }
        }
    }
}
