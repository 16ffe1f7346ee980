package dev.kcm.receiver.host;

import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.util.Locale;

import org.slf4j.ILoggerFactory;
import org.slf4j.IMarkerFactory;
import org.slf4j.Marker;
import org.slf4j.event.Level;
import org.slf4j.helpers.BasicMDCAdapter;
import org.slf4j.helpers.BasicMarkerFactory;
import org.slf4j.helpers.LegacyAbstractLogger;
import org.slf4j.helpers.MessageFormatter;
import org.slf4j.spi.MDCAdapter;
import org.slf4j.spi.SLF4JServiceProvider;

/**
 * The host's SLF4J provider: what the plugin and its producer log goes to stderr, one line an event, as
 * {@code LEVEL logger: message} (a throwable as {@code (class: message)}, its stack trace only at DEBUG), which
 * kcm_sandbox.java_receiver forwards to Python logging at the same level. Never stdout: that is the reply channel.
 *
 * <p>Selected with {@code -Dslf4j.provider=dev.kcm.receiver.host.StderrLogs}; the least level logged is
 * {@code -Dkcm.host.log.level} (TRACE, DEBUG, INFO (the default), WARN or ERROR). Kafka's own loggers
 * ({@code org.apache.kafka}) log WARN and above only, whatever the level: at INFO a producer logs its whole config.
 */
public final class StderrLogs implements SLF4JServiceProvider {
    static final String LEVEL_PROPERTY = "kcm.host.log.level";
    private static final String KAFKA = "org.apache.kafka";
    // UTF-8 whatever the platform's encoding, flushed at every line; println is atomic per call.
    private static final PrintStream ERR = new PrintStream(new FileOutputStream(FileDescriptor.err), true,
            StandardCharsets.UTF_8);

    private final IMarkerFactory markers = new BasicMarkerFactory();
    private final MDCAdapter mdc = new BasicMDCAdapter();
    private Factory factory;

    @Override
    public ILoggerFactory getLoggerFactory() {
        return factory;
    }

    @Override
    public IMarkerFactory getMarkerFactory() {
        return markers;
    }

    @Override
    public MDCAdapter getMDCAdapter() {
        return mdc;
    }

    @Override
    public String getRequestedApiVersion() {
        return "2.0.99";
    }

    @Override
    public void initialize() {
        factory = new Factory(least(System.getProperty(LEVEL_PROPERTY)));
    }

    /** The level named (WARNING read as WARN), INFO for none or an unknown name. */
    static Level least(String name) {
        if (name == null) {
            return Level.INFO;
        }
        String upper = name.trim().toUpperCase(Locale.ROOT);
        if (upper.equals("WARNING")) {
            return Level.WARN;
        }
        for (Level level : Level.values()) {
            if (level.name().equals(upper)) {
                return level;
            }
        }
        return Level.INFO;
    }

    /** One line: control characters that would start another line escaped as Python's kcm logs spell them. */
    static String oneLine(String text) {
        StringBuilder out = new StringBuilder(text.length());
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\u0085', '\u2028', '\u2029', '\u000b', '\u000c', '\u001c', '\u001d', '\u001e' ->
                        out.append(String.format("\\u%04x", (int) c));
                default -> out.append(c);
            }
        }
        return out.toString();
    }

    static String line(Level level, String logger, String message, Throwable thrown) {
        StringBuilder text = new StringBuilder(level.name()).append(' ').append(logger).append(": ")
                .append(message == null ? "" : message);
        if (thrown != null) {
            text.append(" (").append(thrown.getClass().getName());
            if (thrown.getMessage() != null) {
                text.append(": ").append(thrown.getMessage());
            }
            text.append(')');
        }
        return oneLine(text.toString());
    }

    private static final class Factory implements ILoggerFactory {
        private final Level least;

        Factory(Level least) {
            this.least = least;
        }

        @Override
        public org.slf4j.Logger getLogger(String name) {
            boolean kafka = name.equals(KAFKA) || name.startsWith(KAFKA + ".");
            // Level.toInt: TRACE 0 … ERROR 40; Kafka's loggers never below WARN.
            int threshold = kafka ? Math.max(least.toInt(), Level.WARN.toInt()) : least.toInt();
            return new ToStderr(name, threshold, least.toInt() <= Level.DEBUG.toInt());
        }
    }

    private static final class ToStderr extends LegacyAbstractLogger {
        private static final long serialVersionUID = 1L;

        private final int threshold;
        private final boolean traces;

        ToStderr(String name, int threshold, boolean traces) {
            this.name = name;
            this.threshold = threshold;
            this.traces = traces;
        }

        @Override
        protected String getFullyQualifiedCallerName() {
            return null;
        }

        @Override
        protected void handleNormalizedLoggingCall(Level level, Marker marker, String message, Object[] arguments,
                Throwable throwable) {
            String text = line(level, name, MessageFormatter.basicArrayFormat(message, arguments), throwable);
            StringBuilder lines = new StringBuilder(text);
            if (throwable != null && traces) {
                // The stack trace, each of its lines a DEBUG line of this logger (never a bare line: Python would
                // take one for the JVM's own output).
                StringWriter trace = new StringWriter();
                throwable.printStackTrace(new PrintWriter(trace));
                for (String traced : trace.toString().split("\\R")) {
                    lines.append(System.lineSeparator()).append(oneLine(Level.DEBUG.name() + " " + name + ": "
                            + traced));
                }
            }
            synchronized (ERR) {
                ERR.println(lines);
            }
        }

        private boolean enabled(Level level) {
            return level.toInt() >= threshold;
        }

        @Override
        public boolean isTraceEnabled() {
            return enabled(Level.TRACE);
        }

        @Override
        public boolean isDebugEnabled() {
            return enabled(Level.DEBUG);
        }

        @Override
        public boolean isInfoEnabled() {
            return enabled(Level.INFO);
        }

        @Override
        public boolean isWarnEnabled() {
            return enabled(Level.WARN);
        }

        @Override
        public boolean isErrorEnabled() {
            return enabled(Level.ERROR);
        }
    }
}
