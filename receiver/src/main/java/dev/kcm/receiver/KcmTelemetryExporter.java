package dev.kcm.receiver;

import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryExporter;
import org.apache.kafka.server.telemetry.ClientTelemetryExporterProvider;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;

/** The plugin for Kafka 4.2 and later (KIP-1217): {@code metric.reporters=dev.kcm.receiver.KcmTelemetryExporter}. */
public class KcmTelemetryExporter extends ReceiverReporter implements ClientTelemetryExporterProvider {
    private final ClientTelemetryExporter exporter;

    public KcmTelemetryExporter() {
        this(new ReceiverCore());
    }

    KcmTelemetryExporter(ReceiverCore core) {
        super(core);
        this.exporter = this::export;
    }

    private void export(ClientTelemetryContext context, ClientTelemetryPayload payload) {
        try {
            core.export(context.authorizableRequestContext(), payload, context.pushIntervalMs());
        // A broken context must not reach the broker either (it would answer the client INVALID_RECORD).
        } catch (Throwable error) {
            core.exportFailed(error);
        }
    }

    @Override
    public ClientTelemetryExporter clientTelemetryExporter() {
        return exporter;
    }
}
