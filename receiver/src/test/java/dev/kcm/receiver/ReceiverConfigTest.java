package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.apache.kafka.common.config.ConfigException;
import org.junit.jupiter.api.Test;

class ReceiverConfigTest {
    private static String failure(String... pairs) {
        KcmClientTelemetry plugin = new KcmClientTelemetry();
        return assertThrows(ConfigException.class, () -> plugin.configure(Fixtures.brokerConfig(pairs))).getMessage();
    }

    @Test
    void badValuesFailStartUpNamingTheProperty() {
        assertTrue(failure("kcm.receiver.queue.max.bytes", "lots").contains("kcm.receiver.queue.max.bytes"));
        assertTrue(failure("kcm.receiver.queue.max.bytes", "10").contains("kcm.receiver.queue.max.bytes"));
        assertTrue(failure("kcm.receiver.topic", "").contains("kcm.receiver.topic"));
        assertTrue(failure("kcm.receiver.topik", "x").contains("kcm.receiver.topik"));
        assertTrue(failure("kcm.receiver.producer.key.serializer", "x")
                .contains("kcm.receiver.producer.key.serializer"));
        assertTrue(failure("kcm.receiver.producer.acks", "some").contains("kcm.receiver.producer.acks"));
        assertTrue(failure("kcm.receiver.producer.linger.ms", "soon").contains("kcm.receiver.producer.linger.ms"));
        // Settings that fail only together are named by the prefix: acks=1 needs idempotence off.
        assertTrue(failure("kcm.receiver.producer.acks", "1").contains("kcm.receiver.producer.*"));
    }

    @Test
    void aBootstrapAddressWithoutAValidPortFailsStartUpNamingTheProperty() {
        for (String property : new String[] {"kcm.receiver.bootstrap.servers",
                "kcm.receiver.producer.bootstrap.servers"}) {
            for (String value : new String[] {"kafka-0", "kafka-0:notaport", "kafka-0:99999", "kafka-0:9092,kafka-1",
                    ":9092", "kafka-0:12345678901", " , "}) {
                String message = failure(property, value);
                assertTrue(message.contains(property), property + "=" + value + ": " + message);
            }
        }
    }

    @Test
    void aBootstrapNameThatDoesNotResolveYetIsAccepted() {
        // The producer retries until it resolves (a StatefulSet's DNS name appears after the pod starts).
        ReceiverConfig config = ReceiverConfig.parse(Fixtures.brokerConfig(
                "kcm.receiver.bootstrap.servers", "kafka-0.kafka.invalid:9092, [::1]:9093"));
        assertEquals("kafka-0.kafka.invalid:9092,[::1]:9093", config.producerConfig.get("bootstrap.servers"));
        ReceiverConfig.parse(Fixtures.brokerConfig("kcm.receiver.producer.bootstrap.servers", "kafka-0.invalid:9092"));
    }

    @Test
    void aMisspeltProducerPropertyFailsStartUpNamingWhatWasMeant() {
        // The producer ignores names it does not know: SASL would silently fall back to PLAINTEXT.
        String message = failure("kcm.receiver.producer.sasl.jass.config", "password=\"hunter2\";");
        assertTrue(message.contains("kcm.receiver.producer.sasl.jass.config is not a producer property; did you "
                + "mean kcm.receiver.producer.sasl.jaas.config?"), message);
        assertFalse(message.contains("hunter2"), message);
        assertTrue(failure("kcm.receiver.producer.security.protocl", "SASL_SSL")
                .contains("kcm.receiver.producer.security.protocol?"));
        // A name far from every producer property is a plugin's (an interceptor's, say): passed on as Kafka does.
        ReceiverConfig config = ReceiverConfig.parse(Fixtures.brokerConfig(
                "kcm.receiver.producer.confluent.monitoring.interceptor.topic", "monitoring"));
        assertEquals("monitoring", config.producerConfig.get("confluent.monitoring.interceptor.topic"));
    }

    @Test
    void aJaasLineKafkaCannotReadFailsStartUpWithoutQuotingIt() {
        // Kafka's own error quotes the rest of an unquoted password with a blank; the writer would log it per retry.
        String module = "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"kcm\" ";
        for (String jaas : new String[] {module + "password=S3CRET PART2-SECRET;",
                                         module + "password=\"S3CRET\"PART2-SECRET\";"}) {
            String message = failure("kcm.receiver.producer.sasl.jaas.config", jaas);
            assertTrue(message.contains(
                    "kcm.receiver.producer.sasl.jaas.config cannot be read as one JAAS login module"), message);
            assertFalse(message.contains("S3CRET") || message.contains("PART2"), message);
        }
        ReceiverConfig.parse(Fixtures.brokerConfig("kcm.receiver.producer.sasl.jaas.config",
                module + "password=\"a b\";"));
    }

    @Test
    void aMisspeltPropertyIsNamedButItsValueNeverShown() {
        String message = failure("kcm.receiver.sasl.jaas.config", "password=\"hunter2\";");
        assertTrue(message.contains("kcm.receiver.sasl.jaas.config"), message);
        assertFalse(message.contains("hunter2"), message);
    }

    @Test
    void withoutListenersTheProducerUsesKafkasDefaultListener() {
        java.util.Map<String, Object> broker = Fixtures.brokerConfig();
        broker.remove("listeners");  // the broker listens on PLAINTEXT://:9092 then
        ReceiverConfig config = ReceiverConfig.parse(broker);
        assertEquals("localhost:9092", config.producerConfig.get("bootstrap.servers"));
        assertEquals("PLAINTEXT", config.producerConfig.get("security.protocol"));
    }

    @Test
    void aProducerBootstrapOverrideNeedsNoListenerToDeriveFrom() {
        java.util.Map<String, Object> broker = Fixtures.brokerConfig(
                "kcm.receiver.producer.bootstrap.servers", "kafka-0:9091");
        broker.put("listeners", "nonsense");
        ReceiverConfig config = ReceiverConfig.parse(broker);
        assertEquals("kafka-0:9091", config.producerConfig.get("bootstrap.servers"));
    }

    @Test
    void anyPushTheQueueCanHoldMayBeSent() {
        assertEquals(16 * 1024 * 1024, ReceiverConfig.parse(Fixtures.brokerConfig()).producerConfig.get("max.request.size"));
        assertEquals(1024 * 1024, ReceiverConfig.parse(Fixtures.brokerConfig("kcm.receiver.queue.max.bytes", "4096"))
                .producerConfig.get("max.request.size"));
        assertEquals("2000000", ReceiverConfig.parse(Fixtures.brokerConfig(
                "kcm.receiver.producer.max.request.size", "2000000")).producerConfig.get("max.request.size"));
    }

    @Test
    void theProducerDefaultsToTheInterBrokerListenerAndIsSafe() {
        ReceiverConfig config = ReceiverConfig.parse(Fixtures.brokerConfig(
                "listeners", "CONTROLLER://:9093,INTERNAL://kafka-0.kafka:9091,EXTERNAL://0.0.0.0:9094",
                "listener.security.protocol.map", "INTERNAL:SSL,EXTERNAL:SASL_SSL,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name", "INTERNAL",
                "kcm.receiver.producer.ssl.truststore.location", "/etc/kafka/truststore.jks"));
        assertEquals("kafka-0.kafka:9091", config.producerConfig.get("bootstrap.servers"));
        assertEquals("SSL", config.producerConfig.get("security.protocol"));
        assertEquals("/etc/kafka/truststore.jks", config.producerConfig.get("ssl.truststore.location"));
        assertEquals(true, config.producerConfig.get("enable.idempotence"));
        assertEquals("zstd", config.producerConfig.get("compression.type"));
        assertEquals(false, config.producerConfig.get("enable.metrics.push"));
        assertEquals("kcm-receiver-3", config.producerConfig.get("client.id"));
        assertEquals("kafka-client-metrics", config.topic);
    }

    @Test
    void aWildcardListenerIsReachedOnLocalhost() {
        ReceiverConfig config = ReceiverConfig.parse(Fixtures.brokerConfig());
        assertEquals("localhost:9092", config.producerConfig.get("bootstrap.servers"));
        assertFalse(config.producerConfig.containsKey("ssl.truststore.location"));
    }

    @Test
    void aControllerOnlyNodeStartsAndStaysIdle() throws Exception {
        // One config for every node, as Strimzi applies spec.kafka.config: a controller has no broker listener.
        try (KcmClientTelemetry plugin = new KcmClientTelemetry()) {
            plugin.configure(Fixtures.brokerConfig("process.roles", "controller",
                    "listeners", "CONTROLLER://:9093", "controller.listener.names", "CONTROLLER"));
            assertEquals(null, plugin.core().metrics());
            plugin.clientReceiver().exportMetrics(Fixtures.requestContext(), Fixtures.payload(new byte[10], false));
        }
        assertTrue(ReceiverConfig.controllerOnly(Fixtures.brokerConfig("process.roles", " Controller ")));
        assertFalse(ReceiverConfig.controllerOnly(Fixtures.brokerConfig("process.roles", "broker,controller")));
        assertFalse(ReceiverConfig.controllerOnly(Fixtures.brokerConfig()));
    }

    @Test
    void controllerListenerNamesAreComparedAsKafkaDoes() {
        ReceiverConfig config = ReceiverConfig.parse(Fixtures.brokerConfig(
                "listeners", "CONTROLLER://:9093,PLAINTEXT://kafka-0:9092", "controller.listener.names", " controller",
                "inter.broker.listener.name", "CONTROLLER"));
        assertEquals("kafka-0:9092", config.producerConfig.get("bootstrap.servers"));
    }
}
