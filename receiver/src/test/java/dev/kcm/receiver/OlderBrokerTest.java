package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertThrows;

import java.net.URL;
import java.net.URLClassLoader;
import java.util.ArrayList;
import java.util.List;

import org.junit.jupiter.api.Test;

/** A broker from Kafka 3.8 to 4.1 lacks the KIP-1217 types: the 3.8 class must load and run without them. */
class OlderBrokerTest {
    private static final String KIP_1217 = "org.apache.kafka.server.telemetry.ClientTelemetry";

    /** The plugin's classes and a broker's libs/ (Kafka, slf4j, codecs), with the 4.2-only types hidden. */
    private static ClassLoader olderBroker() throws Exception {
        List<URL> urls = new ArrayList<>();
        for (String anchor : new String[] {"dev.kcm.receiver.KcmClientTelemetry", "org.apache.kafka.common.Uuid",
                "org.slf4j.LoggerFactory", "com.github.luben.zstd.Zstd", "net.jpountz.lz4.LZ4Factory",
                "org.xerial.snappy.Snappy"}) {
            urls.add(Class.forName(anchor).getProtectionDomain().getCodeSource().getLocation());
        }
        return new URLClassLoader(urls.toArray(new URL[0]), ClassLoader.getPlatformClassLoader()) {
            @Override
            protected Class<?> loadClass(String name, boolean resolve) throws ClassNotFoundException {
                if (name.startsWith(KIP_1217 + "Exporter") || name.equals(KIP_1217 + "Context")) {
                    throw new ClassNotFoundException(name + " (not in Kafka before 4.2)");
                }
                return super.loadClass(name, resolve);
            }
        };
    }

    @Test
    void the38ClassLoadsAndConfiguresWithoutKafka42Types() throws Exception {
        // The test classes' log capture (RunTests) is not on this broker's classpath: its slf4j finds no provider.
        String provider = System.clearProperty("slf4j.provider");
        try {
            loadAndConfigure();
        } finally {
            if (provider != null) {
                System.setProperty("slf4j.provider", provider);
            }
        }
    }

    private static void loadAndConfigure() throws Exception {
        ClassLoader loader = olderBroker();
        Class<?> plugin = loader.loadClass("dev.kcm.receiver.KcmClientTelemetry");
        AutoCloseable instance = (AutoCloseable) plugin.getDeclaredConstructor().newInstance();
        // Kafka loads configured classes through the context loader, as a broker's plugin loading sets it.
        Thread thread = Thread.currentThread();
        ClassLoader previous = thread.getContextClassLoader();
        thread.setContextClassLoader(loader);
        try {
            plugin.getMethod("configure", java.util.Map.class).invoke(instance, Fixtures.brokerConfig(
                    "kcm.receiver.close.timeout.ms", "0"));
            instance.close();
        } finally {
            thread.setContextClassLoader(previous);
        }
        // The filter is real: the 4.2 class cannot load there.
        assertThrows(NoClassDefFoundError.class,
                () -> loader.loadClass("dev.kcm.receiver.KcmTelemetryExporter").getDeclaredConstructor().newInstance());
    }
}
