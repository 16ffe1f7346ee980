package dev.kcm.receiver;

import java.util.ArrayList;
import java.util.List;

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
 * An SLF4J provider keeping every WARN and ERROR line the plugin logs, so tests read what a broker's log would
 * show. RunTests selects it ({@code slf4j.provider}) before anything logs.
 */
public final class CapturedLogs implements SLF4JServiceProvider {
    private static final List<String> LINES = new ArrayList<>();

    private final IMarkerFactory markers = new BasicMarkerFactory();
    private final MDCAdapter mdc = new BasicMDCAdapter();

    /** The WARN and ERROR lines logged so far containing `text`, as "LEVEL message". */
    static List<String> containing(String text) {
        synchronized (LINES) {
            return LINES.stream().filter(line -> line.contains(text)).toList();
        }
    }

    static void clear() {
        synchronized (LINES) {
            LINES.clear();
        }
    }

    /** Whether the provider is in use: the tests reading logs need it. */
    static boolean active() {
        return org.slf4j.LoggerFactory.getILoggerFactory() instanceof Factory;
    }

    @Override
    public ILoggerFactory getLoggerFactory() {
        return new Factory();
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
    }

    private static final class Factory implements ILoggerFactory {
        @Override
        public org.slf4j.Logger getLogger(String name) {
            return new Kept(name);
        }
    }

    private static final class Kept extends LegacyAbstractLogger {
        private static final long serialVersionUID = 1L;

        Kept(String name) {
            this.name = name;
        }

        @Override
        protected String getFullyQualifiedCallerName() {
            return null;
        }

        @Override
        protected void handleNormalizedLoggingCall(Level level, Marker marker, String message, Object[] arguments,
                Throwable throwable) {
            String text = MessageFormatter.basicArrayFormat(message, arguments);
            synchronized (LINES) {
                LINES.add(level + " " + text);
            }
        }

        @Override
        public boolean isTraceEnabled() {
            return false;
        }

        @Override
        public boolean isDebugEnabled() {
            return false;
        }

        @Override
        public boolean isInfoEnabled() {
            return false;
        }

        @Override
        public boolean isWarnEnabled() {
            return true;
        }

        @Override
        public boolean isErrorEnabled() {
            return true;
        }
    }
}
