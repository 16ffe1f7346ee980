package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

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
}
