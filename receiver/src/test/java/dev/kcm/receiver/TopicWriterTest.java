package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.network.ClientInformation;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Test;

/** The writer beside ReceiverCoreTest's: its budget at the edges, close, the producer retried, failures paced. */
class TopicWriterTest {
    private static final byte[] DATA = new byte[100];

    private static TopicWriter writer(MockProducer<byte[], byte[]> producer, ReceiverMetrics metrics, long maxBytes,
            long closeTimeoutMs) {
        return new TopicWriter(() -> producer, push -> ContractRecord.build("t", push, "1", "c"), metrics, maxBytes,
                closeTimeoutMs);
    }

    @Test
    void aPushBeyondTheBudgetIsDroppedAndCountedAndHoldsNoBytes() throws Exception {
        // The producer never acknowledges: what was taken stays held. offer() itself is the last guard (the request
        // thread's hasRoomFor check and the offer are not atomic), so it is exercised directly.
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(false);
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        Push first = Fixtures.push(Fixtures.requestContext(), DATA, null);
        long weight = first.weight();
        try (TopicWriter writer = writer(producer, metrics, 2 * weight, 0)) {
            assertTrue(writer.offer(first));
            assertTrue(writer.hasRoomFor(weight), "a push that fills the budget exactly fits");
            assertTrue(writer.offer(Fixtures.push(Fixtures.requestContext(), DATA, null)));
            assertFalse(writer.hasRoomFor(1));
            assertFalse(writer.offer(Fixtures.push(Fixtures.requestContext(), DATA, null)));
            assertEquals(1, metrics.pushesDropped.sum());
            assertEquals(2 * weight, writer.heldBytes(), "the dropped push holds nothing");
        } finally {
            metrics.close();
        }
    }

    @Test
    void tinyPushesAndLongSoftwareNamesCountAgainstTheBudgetToo() throws Exception {
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        try (TopicWriter writer = writer(Fixtures.mockProducer(false), metrics, 1024, 0)) {
            int taken = 0;
            for (int i = 0; i < 10; i++) {
                taken += writer.offer(Fixtures.push(Fixtures.requestContext("", ClientInformation.EMPTY, null),
                        new byte[1], null)) ? 1 : 0;
            }
            assertEquals(3, taken, "a 1-byte push weighs its 256-byte allowance and its text");
        } finally {
            metrics.close();
        }
        // The software name is text the client chose, kept by the context as the client id is.
        ReceiverMetrics more = new ReceiverMetrics(() -> 0);
        try (TopicWriter writer = writer(Fixtures.mockProducer(false), more, 1 << 20, 0)) {
            ClientInformation software = new ClientInformation("n".repeat(30_000), "1");
            int taken = 0;
            for (int i = 0; i < 100; i++) {
                taken += writer.offer(Fixtures.push(Fixtures.requestContext("c", software, null), new byte[1], null))
                        ? 1 : 0;
            }
            assertEquals(17, taken, "a 1 MiB queue holds 17 pushes carrying 60 KB of software name each");
        } finally {
            more.close();
        }
    }

    @Test
    void closeGivesTheProducerWhatIsLeftOfTheTimeoutToFinishSending() throws Exception {
        // A producer closed with no time aborts the batches it still holds: acknowledged-by-us pushes lost.
        AtomicReference<Duration> given = new AtomicReference<>();
        MockProducer<byte[], byte[]> producer = new MockProducer<>(true, null, new ByteArraySerializer(),
                new ByteArraySerializer()) {
            @Override
            public void close(Duration timeout) {
                given.set(timeout);
                super.close(timeout);
            }
        };
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        TopicWriter writer = writer(producer, metrics, 1 << 20, 5000);
        try {
            writer.offer(Fixtures.push(Fixtures.requestContext(), DATA, null));
            Fixtures.await(() -> producer.history().size() == 1);
            writer.close();
            assertTrue(given.get().toMillis() > 1000, "producer closed with " + given.get());
        } finally {
            metrics.close();
        }
    }

    @Test
    void aProducerThatCannotBeBuiltIsRetriedWithGrowingPauses() throws Exception {
        // 1 s, then 2 s, ... up to 30 s: a bootstrap name that never resolves must not be retried every second.
        AtomicInteger attempts = new AtomicInteger();
        ReceiverMetrics metrics = new ReceiverMetrics(() -> 0);
        TopicWriter writer = new TopicWriter(() -> {
            attempts.incrementAndGet();
            throw new KafkaException("Failed to construct kafka producer");
        }, push -> ContractRecord.build("t", push, "1", "c"), metrics, 1 << 20, 0);
        try {
            Fixtures.await(() -> attempts.get() == 2);   // at once, then a second later
            // The next pause is 2 s: none within 1.5 s (with a constant 1 s pause there would be), however late.
            Thread.sleep(1500);
            assertEquals(2, attempts.get(), "the pause after the second attempt grows to 2 s");
        } finally {
            writer.close();
            metrics.close();
        }
    }

    @Test
    void aWarningIsLoggedAtOnceAndThenAtMostOncePer10sCountingEveryEventSinceTheLineBefore() {
        AtomicLong clockMs = new AtomicLong(5_000);
        List<String> lines = new ArrayList<>();
        TopicWriter.PacedWarning warning = new TopicWriter.PacedWarning("could not be written", clockMs::get,
                lines::add);
        warning.occurred("down");
        assertEquals(List.of("kcm receiver: 1 push could not be written: down"), lines);
        warning.occurred("down");
        warning.occurred("still down");
        clockMs.addAndGet(9_999);
        warning.flush(false);
        assertEquals(1, lines.size(), "held back within 10 s");
        clockMs.addAndGet(1);
        warning.flush(false);
        assertEquals("kcm receiver: 2 pushes could not be written since the last such warning: the last: still down",
                lines.get(1));
        clockMs.addAndGet(60_000);
        warning.flush(false);
        assertEquals(2, lines.size(), "nothing to say, nothing said");
        warning.occurred("down again");
        assertEquals("kcm receiver: 1 push could not be written since the last such warning: down again",
                lines.get(2));
    }
}
