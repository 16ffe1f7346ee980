package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

import javax.management.ObjectName;

import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.junit.jupiter.api.Test;

/** The plugin as the broker drives it: counters, the broker's buffer, errors, configuring again and close. */
@SuppressWarnings("removal")
class PluginLifecycleTest {
    private static final byte[] METRICS = new byte[600];

    @Test
    void bytesReceivedCountsWhatTheBrokerHandedOverBeforeAnyIsWritten() throws Exception {
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(false);   // never acknowledges
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig("kcm.receiver.close.timeout.ms", "0"));
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(new byte[0], false));
            assertEquals(METRICS.length, Fixtures.count(plugin.core(), "bytes-received-total"));
            assertEquals(0, Fixtures.count(plugin.core(), "bytes-written-total"));
        }
    }

    @Test
    void theBrokersBufferIsLeftAsItWasHanded() throws Exception {
        // The broker hands the same buffer to every reader of the payload: the plugin must not move its position.
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        ByteBuffer shared = ByteBuffer.wrap(new byte[] {1, 2, 3, 4}).asReadOnlyBuffer();
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig());
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(),
                    Fixtures.payload(() -> shared, false, Fixtures.BROKER_CONTENT_TYPE));
            assertEquals(0, shared.position());
            assertEquals(4, shared.remaining());
            Fixtures.await(() -> producer.history().size() == 1);
        }
    }

    @Test
    void anErrorNotAnExceptionFromTheBrokersObjectsIsCountedNotThrown() throws Exception {
        // A LinkageError (a broker whose API differs from the one compiled against) is an Error, not an Exception:
        // escaping, it would make the broker answer the client INVALID_RECORD.
        ClientTelemetryPayload linkage = Fixtures.payload(() -> {
            throw new NoSuchMethodError("ClientTelemetryPayload.data()");
        }, false, null);
        ClientTelemetryContext abstractContext = new ClientTelemetryContext() {
            @Override
            public int pushIntervalMs() {
                throw new AbstractMethodError("pushIntervalMs");
            }

            @Override
            public AuthorizableRequestContext authorizableRequestContext() {
                throw new AbstractMethodError("authorizableRequestContext");
            }
        };
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        try (KcmTelemetryExporter plugin = new KcmTelemetryExporter(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig());
            assertDoesNotThrow(() -> plugin.clientTelemetryExporter().exportMetrics(abstractContext,
                    Fixtures.payload(METRICS, false)));
            assertEquals(1, Fixtures.count(plugin.core(), "export-errors-total"));
        }
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer))) {
            plugin.configure(Fixtures.brokerConfig());
            assertDoesNotThrow(() -> plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), linkage));
            assertEquals(1, Fixtures.count(plugin.core(), "export-errors-total"));
            assertEquals(1, Fixtures.count(plugin.core(), "pushes-received-total"));
        }
    }

    @Test
    void closingThePluginClosesItsProducerAndUnregistersItsCounters() throws Exception {
        ObjectName counters = new ObjectName("kafka.server:type=kcm-receiver");
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
        KcmClientTelemetry plugin = new KcmClientTelemetry(new ReceiverCore(config -> producer));
        plugin.configure(Fixtures.brokerConfig());
        plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
        Fixtures.await(() -> producer.history().size() == 1);
        assertTrue(ManagementFactory.getPlatformMBeanServer().isRegistered(counters));
        plugin.close();
        assertTrue(producer.closed(), "the producer and its network thread outlive the plugin");
        assertFalse(ManagementFactory.getPlatformMBeanServer().isRegistered(counters),
                "the counters' MBean outlives the plugin");
    }

    @Test
    void twoPluginsInOneBrokerKeepTheirOwnMBeansAndClosingOneLeavesTheOther() throws Exception {
        // Both classes listed in metric.reporters (a move to Kafka 4.2's interface): the first keeps the bare name.
        ObjectName first = new ObjectName("kafka.server:type=kcm-receiver");
        ObjectName second = new ObjectName("kafka.server:type=kcm-receiver,instance=2");
        KcmClientTelemetry older = new KcmClientTelemetry(new ReceiverCore(config -> Fixtures.mockProducer(true)));
        KcmTelemetryExporter newer = new KcmTelemetryExporter(new ReceiverCore(config -> Fixtures.mockProducer(true)));
        try {
            older.configure(Fixtures.brokerConfig());
            newer.configure(Fixtures.brokerConfig());
            older.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(METRICS, false));
            assertEquals(1.0, ManagementFactory.getPlatformMBeanServer().getAttribute(first, "pushes-received-total"));
            assertEquals(0.0, ManagementFactory.getPlatformMBeanServer().getAttribute(second, "pushes-received-total"));
            newer.close();
            assertTrue(ManagementFactory.getPlatformMBeanServer().isRegistered(first), "closing one unregistered both");
            assertFalse(ManagementFactory.getPlatformMBeanServer().isRegistered(second));
        } finally {
            newer.close();
            older.close();
        }
        assertFalse(ManagementFactory.getPlatformMBeanServer().isRegistered(first));
    }

    @Test
    void configuringAgainClosesTheFirstWriterAndItsProducer() throws Exception {
        List<MockProducer<byte[], byte[]>> built = new ArrayList<>();
        ReceiverCore core = new ReceiverCore(config -> {
            MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(true);
            synchronized (built) {
                built.add(producer);
            }
            return producer;
        });
        try (KcmClientTelemetry plugin = new KcmClientTelemetry(core)) {
            plugin.configure(Fixtures.brokerConfig());
            Fixtures.await(() -> {
                synchronized (built) {
                    return built.size() == 1;
                }
            });
            plugin.configure(Fixtures.brokerConfig("kcm.receiver.topic", "other"));
            Fixtures.await(() -> built.get(0).closed());
        }
    }
}
