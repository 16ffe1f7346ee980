package dev.kcm.receiver;

import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import java.util.function.BooleanSupplier;
import java.util.function.Supplier;

import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.message.PushTelemetryRequestData;
import org.apache.kafka.common.network.ClientInformation;
import org.apache.kafka.common.network.ListenerName;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.requests.PushTelemetryRequest;
import org.apache.kafka.common.requests.RequestContext;
import org.apache.kafka.common.requests.RequestHeader;
import org.apache.kafka.common.security.auth.KafkaPrincipal;
import org.apache.kafka.common.security.auth.SecurityProtocol;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;

/** What the broker hands a plugin, built the way the broker builds it. */
final class Fixtures {
    static final Uuid INSTANCE = new Uuid(0x0123456789abcdefL, 0x0fedcba987654321L);
    // The payload's content type as a broker gives it: PushTelemetryRequest's ("OTLP"), not the contract's.
    static final String BROKER_CONTENT_TYPE = new PushTelemetryRequest(new PushTelemetryRequestData(), (short) 0)
            .metricsContentType();

    private Fixtures() {
    }

    static MockProducer<byte[], byte[]> mockProducer(boolean autoComplete) {
        return new MockProducer<>(autoComplete, null, new ByteArraySerializer(), new ByteArraySerializer());
    }

    /** The value of the plugin's counter `name`. */
    static long count(ReceiverCore core, String name) {
        return ((Number) core.metrics().registry().metrics().entrySet().stream()
                .filter(entry -> entry.getKey().name().equals(name))
                .findFirst().orElseThrow().getValue().metricValue()).longValue();
    }

    static void await(BooleanSupplier condition) throws InterruptedException {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("condition not met within 10 s");
            }
            Thread.sleep(5);
        }
    }

    static RequestContext requestContext(String clientId, ClientInformation software, Integer port) {
        try {
            return new RequestContext(new RequestHeader(ApiKeys.PUSH_TELEMETRY, (short) 0, clientId, 7),
                    "conn-1", InetAddress.getByName("10.1.2.3"), Optional.ofNullable(port),
                    new KafkaPrincipal(KafkaPrincipal.USER_TYPE, "alice"),
                    ListenerName.normalised("SASL_SSL"), SecurityProtocol.SASL_SSL, software, false);
        } catch (UnknownHostException e) {
            throw new AssertionError(e);
        }
    }

    static RequestContext requestContext() {
        return requestContext("payments-1", new ClientInformation("apache-kafka-java", "4.3.0"), 51234);
    }

    static ClientTelemetryPayload payload(byte[] data, boolean terminating) {
        return payload(() -> ByteBuffer.wrap(data).asReadOnlyBuffer(), terminating, BROKER_CONTENT_TYPE);
    }

    /** A payload whose data() is what `data` gives (or throws), as a broker's object may. */
    static ClientTelemetryPayload payload(Supplier<ByteBuffer> data, boolean terminating, String contentType) {
        return new ClientTelemetryPayload() {
            @Override
            public Uuid clientInstanceId() {
                return INSTANCE;
            }

            @Override
            public boolean isTerminating() {
                return terminating;
            }

            @Override
            public String contentType() {
                return contentType;
            }

            @Override
            public ByteBuffer data() {
                return data.get();
            }
        };
    }

    static Push push(AuthorizableRequestContext context, byte[] data, Integer pushIntervalMs) {
        return new Push(context, INSTANCE, false, BROKER_CONTENT_TYPE, data, pushIntervalMs);
    }

    static Map<String, String> headers(ProducerRecord<byte[], byte[]> record) {
        Map<String, String> out = new HashMap<>();
        for (Header header : record.headers()) {
            out.put(header.key(), new String(header.value(), StandardCharsets.UTF_8));
        }
        return out;
    }

    static Map<String, Object> brokerConfig(String... pairs) {
        Map<String, Object> config = new HashMap<>();
        config.put("node.id", "3");
        config.put("listeners", "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093");
        config.put("controller.listener.names", "CONTROLLER");
        for (int i = 0; i < pairs.length; i += 2) {
            config.put(pairs[i], pairs[i + 1]);
        }
        return config;
    }
}
