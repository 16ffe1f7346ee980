package dev.kcm.receiver;

import static org.junit.platform.engine.discovery.DiscoverySelectors.selectPackage;

import java.io.PrintWriter;

import org.junit.platform.launcher.Launcher;
import org.junit.platform.launcher.LauncherDiscoveryRequest;
import org.junit.platform.launcher.core.LauncherDiscoveryRequestBuilder;
import org.junit.platform.launcher.core.LauncherFactory;
import org.junit.platform.launcher.listeners.SummaryGeneratingListener;
import org.junit.platform.launcher.listeners.TestExecutionSummary;

/**
 * Runs every JUnit test of the plugin and exits non-zero when one fails, is aborted or is skipped (the console
 * launcher is not shipped).
 */
public final class RunTests {
    private RunTests() {
    }

    public static void main(String[] args) {
        // Before anything logs: the tests read the plugin's warnings from it.
        System.setProperty("slf4j.provider", CapturedLogs.class.getName());
        LauncherDiscoveryRequest request = LauncherDiscoveryRequestBuilder.request()
                .selectors(selectPackage("dev.kcm.receiver")).build();
        SummaryGeneratingListener listener = new SummaryGeneratingListener();
        Launcher launcher = LauncherFactory.create();
        launcher.execute(request, listener);
        TestExecutionSummary summary = listener.getSummary();
        PrintWriter out = new PrintWriter(System.out, true);
        summary.printFailuresTo(out, 25);
        summary.printTo(out);
        // An aborted (failed assumption) or skipped (@Disabled) test is a missing part, not a pass.
        boolean passed = summary.getTotalFailureCount() == 0 && summary.getTestsAbortedCount() == 0
                && summary.getTestsSkippedCount() == 0 && summary.getTestsSucceededCount() > 0;
        System.exit(passed ? 0 : 1);
    }
}
