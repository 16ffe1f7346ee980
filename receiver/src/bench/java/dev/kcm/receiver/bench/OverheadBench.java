package dev.kcm.receiver.bench;

import java.lang.management.ManagementFactory;
import java.net.InetAddress;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import java.util.Random;

import javax.management.MBeanServer;
import javax.management.ObjectName;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.metrics.KafkaMetricsContext;
import org.apache.kafka.common.network.ClientInformation;
import org.apache.kafka.common.network.ListenerName;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.requests.RequestContext;
import org.apache.kafka.common.requests.RequestHeader;
import org.apache.kafka.common.security.auth.KafkaPrincipal;
import org.apache.kafka.common.security.auth.SecurityProtocol;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryExporter;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;

import dev.kcm.receiver.KcmTelemetryExporter;

/**
 * Times exportMetrics on the calling thread, as a broker's request thread calls it, against a bare copy of the same
 * payload; then waits for every push to be written. Usage: OverheadBench BOOTSTRAP TOPIC INSTANCES PUSHES.
 * Prints one JSON object.
 */
public final class OverheadBench {
    private static final ObjectName COUNTERS;

    static {
        try {
            COUNTERS = new ObjectName("kafka.server:type=kcm-receiver");
        } catch (Exception e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    private OverheadBench() {
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int instances = Integer.parseInt(args[2]);
        int pushes = Integer.parseInt(args[3]);
        Random random = new Random(714);
        RequestContext[] contexts = new RequestContext[instances];
        Payload[] payloads = new Payload[instances];
        for (int i = 0; i < instances; i++) {
            contexts[i] = new RequestContext(new RequestHeader(ApiKeys.PUSH_TELEMETRY, (short) 0, "client-" + i, i),
                    "conn-" + i, InetAddress.getByAddress(new byte[] {10, 0, (byte) (i >> 8), (byte) i}),
                    Optional.of(30000 + i % 30000), KafkaPrincipal.ANONYMOUS,
                    ListenerName.forSecurityProtocol(SecurityProtocol.PLAINTEXT), SecurityProtocol.PLAINTEXT,
                    new ClientInformation("apache-kafka-java", "4.3.0"), false);
            byte[] data = new byte[2048 + random.nextInt(2049)];
            random.nextBytes(data);
            data[0] = 0x0a;  // not a compression magic: a plain MetricsData as 3.8+ brokers hand it
            payloads[i] = new Payload(new Uuid(random.nextLong(), random.nextLong()), ByteBuffer.wrap(data));
        }
        Map<String, Object> config = new HashMap<>();
        config.put("node.id", "1");
        config.put("kcm.receiver.bootstrap.servers", bootstrap);
        config.put("kcm.receiver.topic", topic);
        config.put("kcm.receiver.queue.max.bytes", String.valueOf(256L * 1024 * 1024));
        config.put("kcm.receiver.close.timeout.ms", "60000");
        KcmTelemetryExporter plugin = new KcmTelemetryExporter();
        plugin.configure(config);
        plugin.contextChange(new KafkaMetricsContext("kafka.server", Map.of("kafka.cluster.id", "bench")));
        ClientTelemetryExporter exporter = plugin.clientTelemetryExporter();

        // Warm both paths up so the JIT has compiled them before anything is timed; warm-up pushes are written too.
        int warmup = Math.min(pushes, 5000);
        time(warmup, instances, payloads, contexts, null);
        time(warmup, instances, payloads, contexts, exporter);
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        long deadline = System.nanoTime() + 120_000_000_000L;
        while (counter(server, "pushes-written-total") + counter(server, "producer-errors-total") < warmup
                && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        long writtenBefore = counter(server, "pushes-written-total");
        long started = System.nanoTime();
        long[] export = time(pushes, instances, payloads, contexts, exporter);
        long[] baseline = time(pushes, instances, payloads, contexts, null);
        int total = warmup + pushes;
        while (counter(server, "pushes-written-total") + counter(server, "producer-errors-total") < total
                && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        long written = counter(server, "pushes-written-total");
        String result = String.format(java.util.Locale.ROOT,
                "{\"instances\": %d, \"pushes\": %d, \"export_p50_us\": %.2f, \"export_p99_us\": %.2f, "
                        + "\"export_max_us\": %.2f, \"copy_p50_us\": %.2f, \"copy_p99_us\": %.2f, "
                        + "\"received\": %d, \"written\": %d, \"dropped\": %d, \"producer_errors\": %d, "
                        + "\"written_per_s\": %.0f, \"bytes_written\": %d}",
                instances, total, percentile(export, 50), percentile(export, 99), percentile(export, 100),
                percentile(baseline, 50), percentile(baseline, 99), counter(server, "pushes-received-total"),
                written, counter(server, "pushes-dropped-total"), counter(server, "producer-errors-total"),
                (written - writtenBefore) / seconds, counter(server, "bytes-written-total"));
        plugin.close();
        System.out.println(result);
    }

    /** Per-call nanoseconds of exportMetrics, or of a bare copy of the payload when exporter is null. */
    private static long[] time(int pushes, int instances, Payload[] payloads, RequestContext[] contexts,
                               ClientTelemetryExporter exporter) {
        long[] nanos = new long[pushes];
        long sink = 0;
        for (int i = 0; i < pushes; i++) {
            int client = i % instances;
            long start = System.nanoTime();
            if (exporter == null) {
                ByteBuffer view = payloads[client].data();
                byte[] copy = new byte[view.remaining()];
                view.get(copy);
                sink += copy[0];
            } else {
                exporter.exportMetrics(new Context(contexts[client]), payloads[client]);
            }
            nanos[i] = System.nanoTime() - start;
        }
        if (sink == 42) {
            System.err.print("");  // keeps the copy from being optimised away
        }
        return nanos;
    }

    private static double percentile(long[] nanos, int percent) {
        long[] sorted = Arrays.copyOf(nanos, nanos.length);
        Arrays.sort(sorted);
        int index = Math.min(sorted.length - 1, (int) Math.ceil(percent / 100.0 * sorted.length) - 1);
        return sorted[Math.max(0, index)] / 1000.0;
    }

    private static long counter(MBeanServer server, String name) throws Exception {
        return ((Number) server.getAttribute(COUNTERS, name)).longValue();
    }

    private static final class Context implements ClientTelemetryContext {
        private final AuthorizableRequestContext request;

        Context(AuthorizableRequestContext request) {
            this.request = request;
        }

        @Override
        public int pushIntervalMs() {
            return 60000;
        }

        @Override
        public AuthorizableRequestContext authorizableRequestContext() {
            return request;
        }
    }

    private static final class Payload implements ClientTelemetryPayload {
        private final Uuid instance;
        private final ByteBuffer data;

        Payload(Uuid instance, ByteBuffer data) {
            this.instance = instance;
            this.data = data;
        }

        @Override
        public Uuid clientInstanceId() {
            return instance;
        }

        @Override
        public boolean isTerminating() {
            return false;
        }

        @Override
        public String contentType() {
            return "application/x-protobuf";
        }

        @Override
        public ByteBuffer data() {
            return data.duplicate();
        }
    }
}
