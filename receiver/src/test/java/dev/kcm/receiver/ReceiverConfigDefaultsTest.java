package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigException;
import org.junit.jupiter.api.Test;

/** The config beside ReceiverConfigTest's: documented defaults, port bounds, typos, the listener chosen. */
class ReceiverConfigDefaultsTest {
    private static String failure(String... pairs) {
        KcmClientTelemetry plugin = new KcmClientTelemetry();
        return assertThrows(ConfigException.class, () -> plugin.configure(Fixtures.brokerConfig(pairs))).getMessage();
    }

    @Test
    void theDocumentedDefaults() {
        ReceiverConfig config = ReceiverConfig.parse(Fixtures.brokerConfig());
        assertEquals(5000L, config.closeTimeoutMs);
        assertEquals(16L * 1024 * 1024, config.queueMaxBytes);
        assertEquals("kafka-client-metrics", config.topic);
    }

    @Test
    void theHighestPortIsAcceptedAndTheNextRefused() {
        assertEquals("kafka-0:65535", ReceiverConfig.parse(Fixtures.brokerConfig(
                "kcm.receiver.bootstrap.servers", "kafka-0:65535")).producerConfig.get("bootstrap.servers"));
        String message = failure("kcm.receiver.bootstrap.servers", "kafka-0:65536");
        assertTrue(message.contains("kcm.receiver.bootstrap.servers"), message);
    }

    @Test
    void aProducerPropertyTwoLettersOffIsATypoToo() {
        String message = failure("kcm.receiver.producer.security.protcl", "SASL_SSL");
        assertTrue(message.contains("did you mean kcm.receiver.producer.security.protocol?"), message);
    }

    @Test
    void withoutAListenerNameTheInterBrokerProtocolChoosesTheListener() {
        ReceiverConfig config = ReceiverConfig.parse(Fixtures.brokerConfig(
                "listeners", "PLAINTEXT://kafka-0:9092,SSL://kafka-0:9093,CONTROLLER://:9094",
                "security.inter.broker.protocol", "SSL"));
        assertEquals("kafka-0:9093", config.producerConfig.get("bootstrap.servers"));
        assertEquals("SSL", config.producerConfig.get("security.protocol"));
    }

    @Test
    void whileTheMetricsClusterIsDownTheProducerBacksOffToThirtySecondsAndDoesNotRebootstrap() {
        // Kafka's defaults (50 ms to 1 s, rebootstrap whenever no node is connectable) flood the broker's log.
        Map<String, Object> producer = ReceiverConfig.parse(Fixtures.brokerConfig()).producerConfig;
        assertEquals(1_000L, producer.get("reconnect.backoff.ms"));
        assertEquals(30_000L, producer.get("reconnect.backoff.max.ms"));
        assertEquals("none", producer.get("metadata.recovery.strategy"));
    }

    @Test
    void theUsersProducerSettingsOverrideTheBackoffDefaults() {
        Map<String, Object> producer = ReceiverConfig.parse(Fixtures.brokerConfig(
                "kcm.receiver.producer.reconnect.backoff.max.ms", "5000",
                "kcm.receiver.producer.metadata.recovery.strategy", "rebootstrap")).producerConfig;
        assertEquals("5000", producer.get("reconnect.backoff.max.ms"));
        assertEquals("rebootstrap", producer.get("metadata.recovery.strategy"));
        assertEquals(1_000L, producer.get("reconnect.backoff.ms"));
    }

    @Test
    void aTopicNameKafkaWouldRefuseFailsStartUpNamingTheProperty() {
        for (String topic : new String[] {"my metrics topic", ".", "..", "metrics/clients", "x".repeat(250)}) {
            String message = failure("kcm.receiver.topic", topic);
            assertTrue(message.contains("kcm.receiver.topic"), topic + ": " + message);
        }
        String longest = "m".repeat(249);
        assertEquals(longest, ReceiverConfig.parse(Fixtures.brokerConfig("kcm.receiver.topic", longest)).topic);
        assertEquals("team-a.client_metrics", ReceiverConfig.parse(Fixtures.brokerConfig(
                "kcm.receiver.topic", "team-a.client_metrics")).topic);
    }

    @Test
    void aMisspeltKcmPrefixFailsStartUpNamingTheKeyAndTheRightPrefix() {
        String message = failure("kcm.reciever.topic", "client-metrics");
        assertTrue(message.contains("kcm.reciever.topic") && message.contains("kcm.receiver."), message);
        assertFalse(message.contains("client-metrics") || message.contains("\n"), message);
    }

    @Test
    void aProducerPropertyInTheWrongCaseFailsStartUpNamingWhatWasMeant() {
        String message = failure("kcm.receiver.producer.SASL.MECHANISM", "SCRAM-SHA-512");
        assertTrue(message.contains("kcm.receiver.producer.SASL.MECHANISM") && message.contains(
                "did you mean kcm.receiver.producer.sasl.mechanism?"), message);
        assertFalse(message.contains("SCRAM"), message);
        assertTrue(failure("kcm.receiver.producer.Acks", "all").contains("kcm.receiver.producer.acks?"));
    }

    @Test
    void producerNamesKafkaDoesNotKnowAreListedForTheStartUpWarning() {
        ReceiverConfig config = ReceiverConfig.parse(Fixtures.brokerConfig(
                "kcm.receiver.producer.confluent.monitoring.interceptor.topic", "monitoring",
                "kcm.receiver.producer.linger.ms", "50"));
        assertEquals(List.of("kcm.receiver.producer.confluent.monitoring.interceptor.topic"),
                config.unknownProducerKeys);
        assertEquals(List.of(), ReceiverConfig.parse(Fixtures.brokerConfig()).unknownProducerKeys);
    }

    @Test
    void aListenerWithoutAPortFailsStartUpNamingListeners() {
        String message = failure("listeners", "PLAINTEXT://kafka-0");
        assertTrue(message.contains("listeners") && message.contains("kcm.receiver.bootstrap.servers"), message);
    }
}
