package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.common.KafkaException;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** What the broker's log says when pushes are dropped or cannot be written: once per 10 s, every one counted. */
@SuppressWarnings("removal")
class WarningsTest {
    private static final byte[] DATA = new byte[100];

    @BeforeEach
    void readTheLog() {
        assertTrue(CapturedLogs.active(), "run through RunTests, which selects the capturing SLF4J provider");
        CapturedLogs.clear();
    }

    private static TopicWriter failingWriter(ReceiverMetrics metrics, AtomicLong clockMs) {
        return new TopicWriter(() -> Fixtures.mockProducer(true), push -> {
            throw new KafkaException("cannot build");
        }, metrics, 1 << 20, 0, clockMs::get);
    }

    @Test
    void pushesDroppedBecauseTheQueueIsFullAreWarnedOfOnceWithTheSettingToRaiseAndAllCounted() throws Exception {
        // The producer never acknowledges (the metrics cluster down): two pushes fill the queue, three more drop.
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        long weight = Fixtures.push(Fixtures.requestContext(), DATA, null).weight();
        TopicWriter writer = new TopicWriter(() -> Fixtures.mockProducer(false),
                push -> ContractRecord.build("t", push, "1", "c"), metrics, 2 * weight, 0);
        try {
            for (int i = 0; i < 5; i++) {
                writer.offer(Fixtures.push(Fixtures.requestContext(), DATA, null));
            }
            assertEquals(3, metrics.pushesDropped.sum());
            List<String> lines = CapturedLogs.containing("push dropped");
            assertEquals(1, lines.size(), lines.toString());
            assertTrue(lines.get(0).startsWith("WARN kcm receiver: 1 push dropped: the queue, "
                    + "kcm.receiver.queue.max.bytes (" + 2 * weight + " bytes), was full"), lines.get(0));
            assertTrue(lines.get(0).contains("raise kcm.receiver.queue.max.bytes"), lines.get(0));
        } finally {
            writer.close();
            metrics.close();
        }
        // The two held back by the pacing are said at close rather than lost.
        List<String> lines = CapturedLogs.containing("pushes dropped");
        assertEquals(1, lines.size(), lines.toString());
        assertTrue(lines.get(0).startsWith("WARN kcm receiver: 2 pushes dropped since the last such warning: the "
                + "queue"), lines.get(0));
    }

    @Test
    void aBrokerAcceptingPushesLargerThanTheQueueIsWarnedOfAtStartUpAndEachSuchPushWhenDropped() throws Exception {
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig("kcm.receiver.queue.max.bytes", "1024",
                    "telemetry.max.bytes", "4096"));
            List<String> startUp = CapturedLogs.containing("telemetry.max.bytes");
            assertEquals(1, startUp.size(), startUp.toString());
            assertTrue(startUp.get(0).contains("up to 4096 bytes (telemetry.max.bytes), but "
                    + "kcm.receiver.queue.max.bytes is 1024 bytes"), startUp.get(0));
            for (int i = 0; i < 3; i++) {
                plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(new byte[2000],
                        false));
            }
            assertEquals(3, Fixtures.count(plugin.core(), "pushes-dropped-total"));
            List<String> dropped = CapturedLogs.containing("push dropped");
            assertEquals(1, dropped.size(), dropped.toString());
            assertTrue(dropped.get(0).contains("1 push dropped: larger than the whole queue, "
                    + "kcm.receiver.queue.max.bytes (1024 bytes)"), dropped.get(0));
            assertTrue(dropped.get(0).contains(
                    "above the largest push (the broker's telemetry.max.bytes, but Kafka before 4.3.1"), dropped.get(0));
        }
    }

    @Test
    void aQueueLargerThanTheBrokersLargestPushGivesNoStartUpWarning() {
        // Kafka's default telemetry.max.bytes (1 MiB, absent from the configs a broker hands its plugins) fits.
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig("kcm.receiver.queue.max.bytes", String.valueOf(2 << 20)));
            plugin.configure(Fixtures.brokerConfig("telemetry.max.bytes", String.valueOf(8 << 20)));
            assertEquals(List.of(), CapturedLogs.containing("telemetry.max.bytes"));
            plugin.configure(Fixtures.brokerConfig("kcm.receiver.queue.max.bytes", String.valueOf(512 << 10)));
            assertEquals(1, CapturedLogs.containing("telemetry.max.bytes").size(),
                    "Kafka's default 1 MiB is larger than a 512 KiB queue");
        }
    }

    @Test
    void writeFailuresHeldBackByThePacingAreSaidAtClose() throws Exception {
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        TopicWriter writer = new TopicWriter(() -> Fixtures.mockProducer(true), push -> {
            throw new KafkaException("cannot build");
        }, metrics, 1 << 20, 0);
        try {
            for (int i = 0; i < 3; i++) {
                writer.offer(Fixtures.push(Fixtures.requestContext(), DATA, null));
            }
            Fixtures.await(() -> metrics.producerErrors.sum() == 3);
            assertEquals(1, CapturedLogs.containing("cannot build").size());
        } finally {
            writer.close();
            metrics.close();
        }
        List<String> lines = CapturedLogs.containing("cannot build");
        assertEquals(2, lines.size(), lines.toString());
        assertTrue(lines.get(1).startsWith("WARN kcm receiver: 2 pushes could not be written to the metrics topic "
                + "since the last such warning: the last: not handed to the producer: "), lines.get(1));
    }

    @Test
    void aWarningAfterAQuietSpellCountsOnlyTheFailuresSinceTheLineBefore() throws Exception {
        // 30 failures, then 25 s of none, then one: the held-back 29 are said once the 10 s have passed, and the
        // last line counts its one failure, not the 29 long before it.
        AtomicLong clockMs = new AtomicLong(1_000_000);
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        TopicWriter writer = failingWriter(metrics, clockMs);
        try {
            for (int i = 0; i < 30; i++) {
                writer.offer(Fixtures.push(Fixtures.requestContext(), DATA, null));
            }
            Fixtures.await(() -> metrics.producerErrors.sum() == 30);
            assertEquals(1, CapturedLogs.containing("cannot build").size());
            clockMs.addAndGet(9_999);
            Thread.sleep(300);   // the writer looks every 100 ms: not yet
            assertEquals(1, CapturedLogs.containing("cannot build").size());
            clockMs.addAndGet(1);
            Fixtures.await(() -> CapturedLogs.containing("cannot build").size() == 2);
            assertTrue(CapturedLogs.containing("cannot build").get(1).startsWith(
                    "WARN kcm receiver: 29 pushes could not be written to the metrics topic since the last such "
                    + "warning"));
            clockMs.addAndGet(25_000);
            writer.offer(Fixtures.push(Fixtures.requestContext(), DATA, null));
            Fixtures.await(() -> CapturedLogs.containing("cannot build").size() == 3);
            assertTrue(CapturedLogs.containing("cannot build").get(2).startsWith(
                    "WARN kcm receiver: 1 push could not be written to the metrics topic since the last such "
                    + "warning: not handed to the producer: "));
        } finally {
            writer.close();
            metrics.close();
        }
        assertEquals(3, CapturedLogs.containing("cannot build").size(), "nothing was left to say at close");
    }
}
