package dev.kcm.receiver;

import org.apache.kafka.server.telemetry.ClientTelemetry;
import org.apache.kafka.server.telemetry.ClientTelemetryReceiver;

/** The plugin for Kafka 3.7 to 4.1: {@code metric.reporters=dev.kcm.receiver.KcmClientTelemetry}. */
// Kafka 4.2 deprecates this pair for removal; brokers 3.7 to 4.1 know nothing else.
@SuppressWarnings("removal")
public class KcmClientTelemetry extends ReceiverReporter implements ClientTelemetry {
    private final ClientTelemetryReceiver receiver;

    public KcmClientTelemetry() {
        this(new ReceiverCore());
    }

    KcmClientTelemetry(ReceiverCore core) {
        super(core);
        this.receiver = (context, payload) -> core.export(context, payload, null);
    }

    @Override
    public ClientTelemetryReceiver clientReceiver() {
        return receiver;
    }
}
