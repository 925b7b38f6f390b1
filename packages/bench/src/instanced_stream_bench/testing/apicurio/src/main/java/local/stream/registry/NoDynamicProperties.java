package local.stream.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.List;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

/**
 * The registry's list of settings that may be changed at run time is built by a Quarkus
 * build step that Maven Central does not serve; a registry for tests offers none.
 */
@ApplicationScoped
public class NoDynamicProperties {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList properties() {
        return new DynamicConfigPropertyList(List.of());
    }
}
