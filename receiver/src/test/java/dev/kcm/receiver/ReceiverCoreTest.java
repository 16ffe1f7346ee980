package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.management.ManagementFactory;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;

import javax.management.ObjectName;

import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.metrics.JmxReporter;
import org.apache.kafka.common.network.ClientInformation;
import org.apache.kafka.common.metrics.KafkaMetricsContext;
import org.apache.kafka.common.metrics.MetricConfig;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.utils.Time;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.junit.jupiter.api.Test;

@SuppressWarnings("removal")
class ReceiverCoreTest {
    private static final byte[] METRICS = new byte[600];

    @Test
    void the38PluginWritesEachPushWithTheBrokerIdentity() throws Exception {
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig("kcm.receiver.topic", "client-metrics"));
            plugin.contextChange(new KafkaMetricsContext("kafka.server",
                    Map.of("kafka.cluster.id", "cluster-x", "kafka.broker.id", "3")));
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
            Fixtures.await(() -> producer.history().size() == 1);
            ProducerRecord<byte[], byte[]> record = producer.history().get(0);
            assertEquals("client-metrics", record.topic());
            Map<String, String> headers = Fixtures.headers(record);
            assertEquals("cluster-x", headers.get("cluster_id"));
            assertEquals("3", headers.get("broker_id"));
            assertTrue(!headers.containsKey("push_interval_ms"), "3.8 API has no push interval");
            Fixtures.await(() -> Fixtures.count(plugin.core(), "pushes-written-total") == 1);
            assertEquals(METRICS.length, Fixtures.count(plugin.core(), "bytes-written-total"));
        }
    }

    @Test
    void aPushThatWaitsInTheQueueKeepsTheTimeTheBrokerAcceptedItAsItsTimestamp() throws Exception {
        // Rollups window by the record's timestamp: a push held through an outage belongs to when it was pushed.
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        java.util.concurrent.CountDownLatch reachable = new java.util.concurrent.CountDownLatch(1);
        ReceiverCore core = new ReceiverCore(config -> {
            try {
                reachable.await();
            } catch (InterruptedException e) {
                throw new KafkaException(e);
            }
            return producer;
        });
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(core)) {
            plugin.configure(Fixtures.brokerConfig());
            long before = System.currentTimeMillis();
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
            long after = System.currentTimeMillis();
            Thread.sleep(300);
            reachable.countDown();
            Fixtures.await(() -> producer.history().size() == 1);
            long timestamp = producer.history().get(0).timestamp();
            assertTrue(before <= timestamp && timestamp <= after, before + " <= " + timestamp + " <= " + after);
        }
    }

    @Test
    void aKraftBrokersNodeIdLabelIsTheBrokerId() throws Exception {
        // KRaft brokers (all of Kafka 4.x) label their metrics context kafka.node.id, not kafka.broker.id.
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig());   // node.id 3 in the config
            plugin.contextChange(new KafkaMetricsContext("kafka.server",
                    Map.of("kafka.cluster.id", "cluster-x", "kafka.node.id", "7")));
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
            Fixtures.await(() -> producer.history().size() == 1);
            assertEquals("7", Fixtures.headers(producer.history().get(0)).get("broker_id"));
        }
    }

    @Test
    void the42PluginAddsThePushInterval() throws Exception {
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        try (KcmTelemetryExporter plugin = new KcmTelemetryExporter(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig());
            plugin.clientTelemetryExporter().exportMetrics(context(Fixtures.requestContext(), 5000),
                    Fixtures.payload(METRICS, true));
            Fixtures.await(() -> producer.history().size() == 1);
            Map<String, String> headers = Fixtures.headers(producer.history().get(0));
            assertEquals("5000", headers.get("push_interval_ms"));
            assertEquals("true", headers.get("terminating"));
        }
    }

    @Test
    void thePayloadIsCopiedBeforeTheBrokerReusesItsBuffer() throws Exception {
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        byte[] buffer = {1, 2, 3, 4};
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig());
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(buffer, false));
            buffer[0] = 9;
            Fixtures.await(() -> producer.history().size() == 1);
            assertEquals(1, producer.history().get(0).value()[0]);
        }
    }

    @Test
    void aFullQueueDropsAndCountsInsteadOfBlocking() throws Exception {
        // The producer never acknowledges, so every push stays held against the 1024-byte budget.
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(false);
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig("kcm.receiver.queue.max.bytes", "1024",
                    "kcm.receiver.close.timeout.ms", "0"));
            for (int i = 0; i < 5; i++) {
                plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
            }
            assertEquals(5, Fixtures.count(plugin.core(), "pushes-received-total"));
            assertEquals(4, Fixtures.count(plugin.core(), "pushes-dropped-total"));
            Fixtures.await(() -> producer.history().size() == 1);
            producer.completeNext();
            Fixtures.await(() -> Fixtures.count(plugin.core(), "pushes-written-total") == 1);
            assertEquals(0, Fixtures.count(plugin.core(), "queue-bytes"));
            // Room again: the next push is taken.
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
            assertEquals(4, Fixtures.count(plugin.core(), "pushes-dropped-total"));
        }
    }

    @Test
    void theClientIdAPushKeepsCountsAgainstTheQueueBudget() throws Exception {
        // 1-byte pushes with a 32 KiB client id (a request header allows that much) were counted 257 bytes each.
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(false);
        String longId = "c".repeat(32_000);
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig("kcm.receiver.queue.max.bytes", String.valueOf(1 << 20),
                    "kcm.receiver.close.timeout.ms", "0"));
            for (int i = 0; i < 100; i++) {
                plugin.clientReceiver().exportMetrics(Fixtures.requestContext(longId,
                        new ClientInformation("apache-kafka-java", "4.3.0"), 51234), Fixtures.payload(new byte[1], false));
            }
            long held = 100 - Fixtures.count(plugin.core(), "pushes-dropped-total");
            assertEquals(16, held, "a 1 MiB queue holds 16 pushes carrying 64 KB of client id each");
            assertTrue(Fixtures.count(plugin.core(), "queue-bytes") > 16 * 64_000L);
        }
    }

    @Test
    void everyPushOfferedWhileThePluginClosesIsWrittenOrCountedDropped() throws Exception {
        // A push offered as close() set its flag and emptied the queue was left there: neither written nor dropped.
        for (int round = 0; round < 40; round++) {
            ReceiverCore core = new ReceiverCore(config -> Fixtures.mockProducer(true));
            core.configure(Fixtures.brokerConfig("kcm.receiver.close.timeout.ms", "0"));
            ReceiverMetrics counters = core.metrics();
            java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
            java.util.concurrent.CountDownLatch started = new java.util.concurrent.CountDownLatch(4);
            List<Thread> threads = new java.util.ArrayList<>();
            for (int t = 0; t < 4; t++) {
                Thread thread = new Thread(() -> {
                    started.countDown();
                    while (!stop.get()) {
                        core.export(Fixtures.requestContext(), Fixtures.payload(new byte[64], false), null);
                    }
                });
                thread.start();
                threads.add(thread);
            }
            started.await();
            Thread.sleep(2);
            core.close();
            Thread.sleep(5);
            stop.set(true);
            for (Thread thread : threads) {
                thread.join();
            }
            // The writer's thread may still be handing over the push it took last.
            Fixtures.await(() -> counters.pushesReceived.sum() == counters.pushesWritten.sum() + counters.pushesDropped.sum()
                    + counters.producerErrors.sum() + counters.exportErrors.sum());
        }
    }

    @Test
    void aProducerThatCannotReachKafkaNeverThrowsIntoTheRequestThread() throws Exception {
        try (KcmClientTelemetry plugin = new KcmClientTelemetry()) {
            plugin.configure(Fixtures.brokerConfig("kcm.receiver.bootstrap.servers", "127.0.0.1:1",
                    "kcm.receiver.producer.max.block.ms", "200", "kcm.receiver.close.timeout.ms", "0"));
            for (int i = 0; i < 3; i++) {
                assertDoesNotThrow(() -> plugin.clientReceiver().exportMetrics(Fixtures.requestContext(),
                        Fixtures.payload(METRICS, false)));
            }
            Fixtures.await(() -> Fixtures.count(plugin.core(), "producer-errors-total") == 3);
            assertEquals(0, Fixtures.count(plugin.core(), "pushes-written-total"));
        }
    }

    @Test
    void aBrokenPayloadIsCountedNotThrown() throws Exception {
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        ClientTelemetryPayload broken = Fixtures.payload(() -> {
            throw new IllegalStateException("buffer released");
        }, false, null);
        try (KcmTelemetryExporter plugin = new KcmTelemetryExporter(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig());
            assertDoesNotThrow(() -> plugin.clientTelemetryExporter().exportMetrics(
                    context(Fixtures.requestContext(), 1000), broken));
            // A context the broker hands broken: counted too, and as received (the documented identity holds).
            ClientTelemetryContext unreadable = new ClientTelemetryContext() {
                @Override
                public int pushIntervalMs() {
                    throw new IllegalStateException("no interval");
                }

                @Override
                public AuthorizableRequestContext authorizableRequestContext() {
                    throw new IllegalStateException("no request");
                }
            };
            assertDoesNotThrow(() -> plugin.clientTelemetryExporter().exportMetrics(
                    unreadable, Fixtures.payload(METRICS, false)));
            assertEquals(2, Fixtures.count(plugin.core(), "export-errors-total"));
            assertEquals(2, Fixtures.count(plugin.core(), "pushes-received-total"));
            assertEquals(List.of(), producer.history());
        }
    }

    @Test
    void anEmptyPushIsCountedAndWritesNoRecord() throws Exception {
        // A Java client whose subscription selects none of its metrics pushes an empty MetricsData (zstd of nothing),
        // which the broker decompresses to zero bytes and still hands over.
        MockProducer<byte[], byte[]> first = Fixtures.mockProducer(true);
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> first))) {
            plugin.configure(Fixtures.brokerConfig());
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(new byte[0], false));
            assertEquals(1, Fixtures.count(plugin.core(), "pushes-empty-total"));
            assertEquals(1, Fixtures.count(plugin.core(), "pushes-received-total"));
        }
        assertEquals(List.of(), first.history());
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);   // a closing plugin closes its producer
        try (KcmTelemetryExporter plugin = new KcmTelemetryExporter(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig());
            plugin.clientTelemetryExporter().exportMetrics(context(Fixtures.requestContext(), 1000),
                    Fixtures.payload(new byte[0], true));
            plugin.clientTelemetryExporter().exportMetrics(context(Fixtures.requestContext(), 1000),
                    Fixtures.payload(METRICS, false));
            Fixtures.await(() -> producer.history().size() == 1);
            assertEquals(METRICS.length, producer.history().get(0).value().length);
            assertEquals(1, Fixtures.count(plugin.core(), "pushes-empty-total"));
            assertEquals(2, Fixtures.count(plugin.core(), "pushes-received-total"));
            assertEquals(0, Fixtures.count(plugin.core(), "export-errors-total"));
        }
    }

    @Test
    void countersAreInTheBrokersJmxDomainAndLeaveTheBrokersOwnAlone() throws Exception {
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        ObjectName brokersCount = new ObjectName("kafka.server:type=kafka-metrics-count");
        // As the broker's own registry: it has a kafka-metrics-count MBean under the same prefix.
        try (Metrics broker = new Metrics(new MetricConfig(), List.of(new JmxReporter()), Time.SYSTEM,
                new KafkaMetricsContext("kafka.server"))) {
            Object before = ManagementFactory.getPlatformMBeanServer().getAttribute(brokersCount, "count");
            assertEquals(((Number) before).doubleValue(), (double) broker.metrics().size());
            try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
                plugin.configure(Fixtures.brokerConfig());
                plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
                Object received = ManagementFactory.getPlatformMBeanServer().getAttribute(
                        new ObjectName("kafka.server:type=kcm-receiver"), "pushes-received-total");
                assertEquals(1.0, ((Number) received).doubleValue());
                assertEquals(before, ManagementFactory.getPlatformMBeanServer().getAttribute(brokersCount, "count"));
            }
            assertTrue(ManagementFactory.getPlatformMBeanServer().isRegistered(brokersCount));
        }
    }

    @Test
    void aPushWhoseRecordCannotBeBuiltIsCountedAndTheWriterGoesOn() throws Exception {
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        AtomicInteger builds = new AtomicInteger();
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        try (TopicWriter writer = new TopicWriter(() -> producer, push -> {
            if (builds.getAndIncrement() == 0) {
                throw new NoSuchFieldError("clientPort");  // what an older broker's classes can throw
            }
            return ContractRecord.build("t", push, "1", "c");
        }, metrics, 1 << 20, 1000)) {
            writer.offer(Fixtures.push(Fixtures.requestContext(), METRICS, null));
            writer.offer(Fixtures.push(Fixtures.requestContext(), METRICS, null));
            Fixtures.await(() -> producer.history().size() == 1);
            Fixtures.await(() -> writer.heldBytes() == 0);
            assertEquals(1, metrics.producerErrors.sum());
        } finally {
            metrics.close();
        }
    }

    @Test
    void aProducerThatCannotBeBuiltYetDoesNotStopTheBrokerAndIsBuiltLater() throws Exception {
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        AtomicInteger attempts = new AtomicInteger();
        ReceiverCore core = new ReceiverCore(config -> {
            if (attempts.incrementAndGet() < 3) {
                throw new KafkaException("Failed to construct kafka producer: no resolvable bootstrap urls");
            }
            return producer;
        });
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(core)) {
            assertDoesNotThrow(() -> plugin.configure(Fixtures.brokerConfig()));
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
            Fixtures.await(() -> producer.history().size() == 1);
            assertEquals(3, attempts.get());
        }
    }

    @Test
    void closeWaitsAtMostItsTimeoutAndZeroMeansNotAtAll() throws Exception {
        KcmClientTelemetry plugin = new KcmClientTelemetry();
        plugin.configure(Fixtures.brokerConfig("kcm.receiver.bootstrap.servers", "127.0.0.1:1",
                "kcm.receiver.producer.max.block.ms", "5000", "kcm.receiver.close.timeout.ms", "0"));
        for (int i = 0; i < 5; i++) {
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
        }
        long started = System.nanoTime();
        plugin.close();
        long tookMs = (System.nanoTime() - started) / 1_000_000;
        assertTrue(tookMs < 2000, "close took " + tookMs + " ms; each queued push could wait 5 s for metadata");
    }

    /** A producer that takes `buildMs` to build (DNS, say), or until interrupted when negative. */
    private static TopicWriter slowlyBuilt(MockProducer<byte[], byte[]> producer, long buildMs,
            java.util.concurrent.CountDownLatch building, ReceiverMetrics metrics, long closeTimeoutMs) {
        return new TopicWriter(() -> {
            building.countDown();
            try {
                Thread.sleep(buildMs < 0 ? Long.MAX_VALUE : buildMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            return producer;
        }, push -> ContractRecord.build("t", push, "1", "c"), metrics, 1 << 20, closeTimeoutMs);
    }

    @Test
    void closeWaitsForAProducerStillBeingBuiltWhichThenWritesWhatIsQueued() throws Exception {
        // The plugin closed moments after start-up (the sandbox's parity test did): the pushes taken meanwhile were
        // dropped without waiting, though the producer was ready within the close timeout.
        java.util.concurrent.CountDownLatch building = new java.util.concurrent.CountDownLatch(1);
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        TopicWriter writer = slowlyBuilt(producer, 300, building, metrics, 5000);
        try {
            building.await();
            for (int i = 0; i < 3; i++) {
                writer.offer(Fixtures.push(Fixtures.requestContext(), METRICS, null));
            }
            writer.close();
            assertEquals(3, producer.history().size());
            assertEquals(0, metrics.pushesDropped.sum());
            assertTrue(producer.closed());
        } finally {
            metrics.close();
        }
    }

    @Test
    void aProducerNotBuiltWithinTheCloseTimeoutDropsAndCountsWithoutLeaking() throws Exception {
        java.util.concurrent.CountDownLatch building = new java.util.concurrent.CountDownLatch(1);
        MockProducer<byte[], byte[]> late = Fixtures.mockProducer(true);
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        TopicWriter writer = slowlyBuilt(late, -1, building, metrics, 500);
        try {
            building.await();
            for (int i = 0; i < 3; i++) {
                writer.offer(Fixtures.push(Fixtures.requestContext(), METRICS, null));
            }
            long started = System.nanoTime();
            writer.close();
            long tookMs = (System.nanoTime() - started) / 1_000_000;
            Fixtures.await(late::closed);  // built after close() gave up on it: closed, not leaked
            assertTrue(tookMs < 2000, "close waited " + tookMs + " ms, beyond its 500 ms timeout");
            assertEquals(3, metrics.pushesDropped.sum());
            assertEquals(0, metrics.producerErrors.sum());
            assertEquals(0, late.history().size());
        } finally {
            metrics.close();
        }
    }

    @Test
    void aWarningNamesWhatCausedTheFailure() {
        KafkaException failure = new KafkaException("Failed to construct kafka producer",
                new IllegalArgumentException("Could not find a 'KafkaClient' entry in the JAAS configuration"));
        String text = TopicWriter.causes(failure);
        assertTrue(text.contains("Failed to construct kafka producer") && text.contains("'KafkaClient' entry"), text);
        // Kafka's JAAS parser quotes what it could not read: for an unquoted password with a blank, the password's end.
        String leaked = TopicWriter.causes(new KafkaException("Failed to create new NetworkClient",
                new IllegalArgumentException("Value not specified for key 'PART2-SECRET' in JAAS config")));
        assertFalse(leaked.contains("PART2-SECRET"), leaked);
        assertTrue(leaked.contains("sasl.jaas.config cannot be read"), leaked);
    }

    private static ClientTelemetryContext context(AuthorizableRequestContext request, int interval) {
        return new ClientTelemetryContext() {
            @Override
            public int pushIntervalMs() {
                return interval;
            }

            @Override
            public AuthorizableRequestContext authorizableRequestContext() {
                return request;
            }
        };
    }
}
